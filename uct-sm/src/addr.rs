//! Addresses: the device address says which host (boot) and namespaces an interface lives in,
//! so shared memory is reachable only between processes that can map each other's segments;
//! the interface address names the segment (mm) or the process (cma).

use std::hash::Hasher;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

/// Device address: a hash of the boot id and one of the ipc, pid and net namespaces.
pub const DEV_ADDR_LEN: usize = 16;

fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// This host's device address (the same for every shared-memory interface of the process).
/// Writes this host's device address (posix, sysv and cma share it) into `buf`.
pub fn write_device_address(buf: &mut [u8]) -> ucs::Result<()> {
    buf.get_mut(..DEV_ADDR_LEN)
        .ok_or(ucs::Status::BufferTooSmall)?
        .copy_from_slice(&host_id());
    Ok(())
}

pub fn host_id() -> [u8; DEV_ADDR_LEN] {
    static ID: OnceLock<[u8; DEV_ADDR_LEN]> = OnceLock::new();
    *ID.get_or_init(|| {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let mut host = std::collections::hash_map::DefaultHasher::new();
        host.write(&boot);
        let boot_h = fnv(&boot, 0xcbf2_9ce4_8422_2325) ^ host.finish().rotate_left(17);
        let mut ns = 0xcbf2_9ce4_8422_2325u64;
        for n in ["ipc", "pid", "net"] {
            let ino = std::fs::metadata(format!("/proc/self/ns/{n}")).map_or(0, |m| m.ino());
            ns = fnv(&ino.to_le_bytes(), ns);
        }
        let mut out = [0u8; DEV_ADDR_LEN];
        out[..8].copy_from_slice(&boot_h.to_le_bytes());
        out[8..].copy_from_slice(&ns.to_le_bytes());
        out
    })
}

/// True when `dev` is this host's device address.
pub fn same_host(dev: &[u8]) -> bool {
    dev == host_id()
}

/// An mm interface address: where its FIFO segment is and how to check it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmAddr {
    pub pid: u32,
    /// posix: the fd number (proc link) or name number; sysv: the shmid.
    pub seg_id: u64,
    pub seg_len: u64,
    /// Random per interface: written in the segment header and in the event socket's name.
    pub nonce: u64,
    /// posix: peers map through `/proc/<pid>/fd`.
    pub proc_link: bool,
}

pub const MM_ADDR_LEN: usize = 29;

impl MmAddr {
    pub fn pack(&self, buf: &mut [u8]) -> Option<()> {
        let out = buf.get_mut(..MM_ADDR_LEN)?;
        out[..4].copy_from_slice(&self.pid.to_le_bytes());
        out[4..12].copy_from_slice(&self.seg_id.to_le_bytes());
        out[12..20].copy_from_slice(&self.seg_len.to_le_bytes());
        out[20..28].copy_from_slice(&self.nonce.to_le_bytes());
        out[28] = self.proc_link as u8;
        Some(())
    }

    pub fn unpack(b: &[u8]) -> Option<MmAddr> {
        if b.len() != MM_ADDR_LEN || b[28] > 1 {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Some(MmAddr {
            pid: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            seg_id: u64_at(4),
            seg_len: u64_at(12),
            nonce: u64_at(20),
            proc_link: b[28] == 1,
        })
    }

    /// The abstract unix socket a sleeping interface is woken through.
    pub fn socket_name(&self) -> String {
        format!("rucx-sm-{}-{:016x}", self.pid, self.nonce)
    }
}

/// A random 64-bit value (not cryptographic: it tells interfaces apart).
pub fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm_address_round_trips_and_rejects_bad_lengths() {
        let a = MmAddr {
            pid: 42,
            seg_id: 7,
            seg_len: 1 << 20,
            nonce: 0xdead_beef,
            proc_link: true,
        };
        let mut b = [0u8; MM_ADDR_LEN];
        a.pack(&mut b).unwrap();
        assert_eq!(MmAddr::unpack(&b), Some(a));
        assert_eq!(MmAddr::unpack(&b[..MM_ADDR_LEN - 1]), None);
        b[28] = 2;
        assert_eq!(MmAddr::unpack(&b), None);
        assert!(same_host(&host_id()));
        assert!(!same_host(&[0; DEV_ADDR_LEN]));
    }
}
