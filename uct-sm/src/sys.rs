//! The system calls of shared memory: creating and mapping segments (posix and sysv), process
//! handles (pidfd), and cross-memory copies (cma). Every other module is safe code on top.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ucs::{Error, Result, Status};

/// A shared mapping of `len` bytes, unmapped when dropped.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    sysv: bool,
}

impl Mapping {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and owns; nothing refers to
        // it after the owner drops it (views into it borrow or hold the owner).
        unsafe {
            if self.sysv {
                libc::shmdt(self.ptr.as_ptr().cast());
            } else {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

/// An anonymous shared mapping of `len` bytes: the segment a test or fuzz body plays a peer's
/// writes into.
#[cfg(any(test, feature = "fuzz"))]
pub fn anon_mapping(len: usize) -> Result<Mapping> {
    // SAFETY: a new anonymous mapping at an address the kernel picks; no existing memory is
    // affected, and the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap", Status::NoMemory));
    }
    let ptr = NonNull::new(p.cast()).ok_or(Status::NoMemory)?;
    Ok(Mapping {
        ptr,
        len,
        sysv: false,
    })
}

fn os_err(what: &str, st: Status) -> Error {
    let e = std::io::Error::last_os_error();
    let msg = format!("{what}: {e}");
    Error::new(st, msg)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `len` rounded up to whole pages.
pub fn page_align(len: usize) -> usize {
    len.div_ceil(page_size()) * page_size()
}

fn map_fd(fd: RawFd, len: usize, what: &str) -> Result<Mapping> {
    // SAFETY: a fresh shared mapping of an fd we hold open; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err(what, Status::ShmemSegment));
    }
    Ok(Mapping {
        ptr: NonNull::new(p.cast()).ok_or(Status::ShmemSegment)?,
        len,
        sysv: false,
    })
}

/// The size of the file behind `fd`.
fn fd_size(fd: RawFd) -> Result<u64> {
    // SAFETY: fstat writes into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is valid for writing.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err("fstat of a shared segment", Status::ShmemSegment));
    }
    Ok(st.st_size as u64)
}

static NEXT_SEG: AtomicU64 = AtomicU64::new(1);

/// The `/dev/shm` name of a posix segment.
pub fn posix_name(pid: u32, id: u64) -> String {
    format!("/rucx-sm-{pid}-{id}")
}

/// A posix segment of this process: the mapping, its fd and its id (the fd number when peers
/// map it through `/proc/<pid>/fd`, else the number in its name).
pub struct PosixSeg {
    pub map: Mapping,
    pub fd: OwnedFd,
    pub id: u64,
    /// The name to unlink at close (when not unlinked at creation).
    pub name: Option<String>,
}

/// Creates a zeroed posix segment of `len` bytes; with `proc_link` its name is removed at once.
pub fn posix_create(len: usize, proc_link: bool) -> Result<PosixSeg> {
    let n = NEXT_SEG.fetch_add(1, Ordering::Relaxed);
    let name = posix_name(std::process::id(), n);
    let cname = CString::new(name.clone()).map_err(|_| Status::InvalidParam)?;
    // SAFETY: a valid C string; flags and mode are plain values.
    let fd = unsafe {
        libc::shm_open(
            cname.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(os_err(&format!("shm_open({name})"), Status::ShmemSegment));
    }
    // SAFETY: `fd` was just returned to us and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let unlink = || {
        // SAFETY: a valid C string.
        unsafe { libc::shm_unlink(cname.as_ptr()) };
    };
    if proc_link {
        unlink();
    }
    // SAFETY: `fd` is open.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        let e = os_err(
            &format!("ftruncate({name}, {len}) (is /dev/shm full?)"),
            Status::NoMemory,
        );
        if !proc_link {
            unlink();
        }
        return Err(e);
    }
    let map = match map_fd(fd.as_raw_fd(), len, "mmap of a new posix segment") {
        Ok(m) => m,
        Err(e) => {
            if !proc_link {
                unlink();
            }
            return Err(e);
        }
    };
    let id = if proc_link { fd.as_raw_fd() as u64 } else { n };
    Ok(PosixSeg {
        map,
        fd,
        id,
        name: (!proc_link).then_some(name),
    })
}

/// Removes a posix segment's name.
pub fn posix_unlink(name: &str) {
    if let Ok(c) = CString::new(name) {
        // SAFETY: a valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

/// Maps the posix segment `id` of process `pid`, which must be at least `len` bytes.
pub fn posix_attach(pid: u32, id: u64, len: usize, proc_link: bool) -> Result<Mapping> {
    let path = if proc_link {
        format!("/proc/{pid}/fd/{id}")
    } else {
        format!("/dev/shm{}", posix_name(pid, id))
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| {
            Error::new(
                Status::Unreachable,
                format!("cannot open the peer's segment {path}: {e} (process gone, or no ptrace permission: try RUCX_POSIX_USE_PROC_LINK=n or RUCX_TLS=sysv)"),
            )
        })?;
    let fd = OwnedFd::from(f);
    let size = fd_size(fd.as_raw_fd())?;
    if size < len as u64 {
        return Err(Error::new(
            Status::ShmemSegment,
            format!("the peer's segment {path} has {size} bytes, its address says {len}"),
        ));
    }
    map_fd(fd.as_raw_fd(), len, "mmap of a peer's posix segment")
}

/// A sysv segment of this process, already marked for removal (it goes with its last detach).
pub struct SysvSeg {
    pub map: Mapping,
    pub id: u64,
}

/// Creates a zeroed sysv segment of at least `len` bytes (whole huge pages with `huge`).
pub fn sysv_create(len: usize, huge: bool) -> Result<SysvSeg> {
    let (len, flags) = if huge {
        (len.div_ceil(2 << 20) * (2 << 20), libc::SHM_HUGETLB)
    } else {
        (len, 0)
    };
    // SAFETY: plain values.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600 | flags) };
    if id < 0 {
        return Err(os_err(
            &format!("shmget({len} bytes) (see kernel.shmmax/shmall)"),
            Status::NoMemory,
        ));
    }
    let map = sysv_map(id, len);
    // Marked for removal now: the segment disappears with its last detach, even after kill -9.
    // Linux lets peers attach a marked segment until then.
    // SAFETY: `id` is a segment we created; IPC_RMID takes no buffer.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    Ok(SysvSeg {
        map: map?,
        id: id as u64,
    })
}

fn sysv_map(id: i32, len: usize) -> Result<Mapping> {
    // SAFETY: attaching a segment at an address the kernel picks.
    let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    if p as isize == -1 {
        return Err(os_err("shmat", Status::Unreachable));
    }
    Ok(Mapping {
        ptr: NonNull::new(p.cast()).ok_or(Status::ShmemSegment)?,
        len,
        sysv: true,
    })
}

/// Attaches the sysv segment `id`, which must be at least `len` bytes.
pub fn sysv_attach(id: u64, len: usize) -> Result<Mapping> {
    let id = i32::try_from(id).map_err(|_| Status::InvalidAddr)?;
    // SAFETY: IPC_STAT writes into a zeroed shmid_ds we own.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) } != 0 {
        return Err(os_err("the peer's sysv segment (gone?)", Status::Unreachable));
    }
    if (ds.shm_segsz as u64) < len as u64 {
        return Err(Error::new(
            Status::ShmemSegment,
            format!(
                "the peer's sysv segment has {} bytes, its address says {len}",
                ds.shm_segsz
            ),
        ));
    }
    sysv_map(id, len)
}

/// A handle to another process that turns readable when it exits (`None` when it is gone
/// already, or the kernel has no pidfd).
pub fn pidfd_open(pid: u32) -> std::result::Result<OwnedFd, i32> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: a new fd owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// True when the process of a pidfd has exited.
pub fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// True when `pid` exists (for kernels without pidfd).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Copies between local `iov` and `[raddr, raddr+len)` of process `pid` (`write`: to it),
/// resuming after partial transfers. Returns the errno on failure.
///
/// # Safety
/// Every local iovec must describe memory valid for the access (readable for `write`,
/// writable otherwise) for the duration of the call.
pub unsafe fn cma_copy(
    pid: u32,
    local: &mut [libc::iovec],
    raddr: u64,
    write: bool,
) -> std::result::Result<(), i32> {
    let total: usize = local.iter().map(|v| v.iov_len).sum();
    let mut done = 0usize;
    let mut first = 0usize;
    while done < total {
        let remote = libc::iovec {
            iov_base: (raddr as usize + done) as *mut libc::c_void,
            iov_len: total - done,
        };
        let rest = &mut local[first..];
        // SAFETY: local iovecs are valid per this function's contract; the remote range is
        // checked by the kernel against the peer's mappings.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, rest.as_ptr(), rest.len() as _, &remote, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, rest.as_ptr(), rest.len() as _, &remote, 1, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EFAULT);
        }
        // Skip what was transferred.
        let mut n = n as usize;
        done += n;
        while n > 0 && first < local.len() {
            let v = &mut local[first];
            if n >= v.iov_len {
                n -= v.iov_len;
                first += 1;
            } else {
                // SAFETY: advancing within the same iovec.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
                v.iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(())
}
