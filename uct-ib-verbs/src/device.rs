//! Device discovery and the device context: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`.

use crate::attr::{c_str_lossy, DeviceAttr, LinkLayer, PortAttr};
use crate::error::{errno, fail, last_errno, rc_errno, unusable, CallKind};
use crate::gid::{Gid, GidEntry, GidType};
use rdma_sys::*;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::{Result, Status};

/// The list of RDMA devices (`ibv_get_device_list`); freed on drop.
///
/// Open the devices you need while the list is alive; opened contexts stay valid after it
/// is dropped.
pub struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. A kernel without RDMA support (`ENOSYS`) gives an empty list, not an
    /// error, so callers can uniformly skip when [`DeviceList::is_empty`].
    pub fn new() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the result is NULL or an array of `n` devices
        // followed by NULL, owned by us until ibv_free_device_list.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = last_errno();
            if e == errno::ENOSYS {
                ucs::debug!("ibv_get_device_list: no kernel RDMA support (ENOSYS); no devices");
                return Ok(DeviceList { list, len: 0 });
            }
            return Err(fail(
                "ibv_get_device_list",
                format_args!(""),
                e,
                CallKind::Control,
            ));
        }
        Ok(DeviceList {
            list,
            len: n.max(0) as usize,
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is no RDMA device.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device `i` (`None` past the end).
    pub fn get(&self, i: usize) -> Option<Device<'_>> {
        if i >= self.len {
            return None;
        }
        // SAFETY: i < len, and the array holds `len` non-NULL device pointers.
        let dev = unsafe { *self.list.add(i) };
        NonNull::new(dev).map(|dev| Device {
            dev,
            _list: PhantomData,
        })
    }

    /// All devices, in the order libibverbs reports them.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(move |i| self.get(i))
    }

    /// The device named `name` (e.g. `"rxe0"`, `"mlx5_0"`).
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: `list` came from ibv_get_device_list and is freed exactly once.
            unsafe { ibv_free_device_list(self.list) };
        }
    }
}

/// One entry of a [`DeviceList`] (borrowed from it).
#[derive(Clone, Copy)]
pub struct Device<'a> {
    dev: NonNull<ibv_device>,
    _list: PhantomData<&'a DeviceList>,
}

impl Device<'_> {
    /// Kernel device name, e.g. `rxe0`.
    pub fn name(&self) -> String {
        // SAFETY: the device is valid while the list is; the name is a NUL-terminated
        // string inside it (or NULL, handled).
        let p = unsafe { ibv_get_device_name(self.dev.as_ptr()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, alive as long as the device list.
        c_str_lossy(unsafe { CStr::from_ptr(p) })
    }

    /// Node GUID in network byte order.
    pub fn guid(&self) -> u64 {
        // SAFETY: the device pointer is valid while the list is.
        unsafe { ibv_get_device_guid(self.dev.as_ptr()) }
    }

    /// Opens the device (`ibv_open_device`).
    pub fn open(&self) -> Result<Arc<Context>> {
        let name = self.name();
        // SAFETY: the device pointer is valid while the list is.
        let ctx = unsafe { ibv_open_device(self.dev.as_ptr()) };
        match NonNull::new(ctx) {
            Some(ctx) => Ok(Arc::new(Context { ctx, name })),
            None => Err(fail(
                "ibv_open_device",
                format_args!("{name}"),
                last_errno(),
                CallKind::Control,
            )),
        }
    }
}

/// An open device (`struct ibv_context`); closed when the last holder drops it.
///
/// Every verbs object holds an `Arc` of its parent, so the context outlives all of them.
pub struct Context {
    ctx: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread; all calls on them are
// thread-safe (providers lock internally), and we never hand out interior references.
unsafe impl Send for Context {}
// SAFETY: as above; &Context only allows thread-safe verbs calls.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device named `name`, or the first device when `name` is `None`.
    /// `Err(NoDevice)` when there is no such device.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>> {
        let list = DeviceList::new()?;
        let dev = match name {
            Some(n) => list.find(n),
            None => list.get(0),
        };
        match dev {
            Some(d) => d.open(),
            None => Err(unusable(
                "Context::open",
                format_args!(
                    "no RDMA device {} among {} found; check `ibv_devices` (for Soft-RoCE: \
                     `rdma link add rxe0 type rxe netdev <if>`)",
                    name.unwrap_or("(any)"),
                    list.len()
                ),
                Status::NoDevice,
            )),
        }
    }

    /// Device name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// Device capabilities (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr is plain C data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_device(self.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_device",
                format_args!("{}", self.name),
                rc_errno(rc),
                CallKind::Control,
            ));
        }
        Ok(DeviceAttr::from_raw(&attr))
    }

    /// Port attributes (`ibv_query_port`; ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is plain C data; all-zero is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // The exported ibv_query_port fills the compat layout, which is a prefix of
        // ibv_port_attr (all fields we read, link_layer included). rdma-sys' inline
        // ___ibv_query_port would take the same path: its extended-context check compares
        // abi_compat with u32::MAX instead of UINTPTR_MAX, so it never sees an extended one.
        // SAFETY: valid context; the out-pointer covers the whole (larger) ibv_port_attr.
        let rc = unsafe {
            ibv_query_port(
                self.as_ptr(),
                port,
                &mut attr as *mut ibv_port_attr as *mut _compat_ibv_port_attr,
            )
        };
        if rc != 0 {
            return Err(fail(
                "ibv_query_port",
                format_args!("{} port {port}", self.name),
                rc_errno(rc),
                CallKind::Control,
            ));
        }
        Ok(PortAttr::from_raw(&attr))
    }

    /// GID `index` of `port` (`ibv_query_gid`).
    pub fn query_gid(&self, port: u8, index: u8) -> Result<Gid> {
        // SAFETY: ibv_gid is a 16-byte union of plain data; zero is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_gid(self.as_ptr(), port, index as i32, &mut gid) };
        if rc != 0 {
            return Err(fail(
                "ibv_query_gid",
                format_args!("{} port {port} index {index}", self.name),
                rc_errno(rc),
                CallKind::Control,
            ));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The type of GID `index` of `port`, from sysfs (`None` when sysfs does not say, e.g.
    /// on InfiniBand ports or for unpopulated entries).
    pub fn gid_type(&self, port: u8, index: u8) -> Option<GidType> {
        let path = format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            self.name
        );
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| GidType::from_sysfs(&t))
    }

    /// Picks the GID to use on `port` the way UCX does by default: on RoCE the first
    /// populated entry in the order RoCE v2 + IPv4, RoCE v2 + IPv6, RoCE v1 + IPv4,
    /// RoCE v1 + IPv6; on InfiniBand index 0.
    pub fn select_gid(&self, port: u8) -> Result<GidEntry> {
        let pattr = self.query_port(port)?;
        if pattr.link_layer != LinkLayer::Ethernet {
            let gid = self.query_gid(port, 0)?;
            return Ok(GidEntry {
                index: 0,
                gid,
                gid_type: self.gid_type(port, 0),
            });
        }
        let n = pattr.gid_tbl_len.clamp(0, 256) as usize;
        let mut table: Vec<GidEntry> = Vec::new();
        for i in 0..n {
            let index = i as u8;
            // unpopulated RoCE entries fail with EINVAL or read as zero; skip them quietly
            let gid = match self.query_gid_quiet(port, index) {
                Some(g) if !g.is_zero() => g,
                _ => continue,
            };
            table.push(GidEntry {
                index,
                gid,
                gid_type: self.gid_type(port, index),
            });
        }
        let prio = [
            (GidType::RoceV2, true),
            (GidType::RoceV2, false),
            (GidType::IbRoceV1, true),
            (GidType::IbRoceV1, false),
        ];
        for (ty, v4) in prio {
            if let Some(e) = table
                .iter()
                .find(|e| e.gid_type == Some(ty) && e.gid.is_ipv4_mapped() == v4)
            {
                return Ok(*e);
            }
        }
        Err(unusable(
            "Context::select_gid",
            format_args!(
                "{} port {port}: no usable RoCE GID (is an IP address configured on the netdev?)",
                self.name
            ),
            Status::NoDevice,
        ))
    }

    /// Like [`Context::query_gid`] but without logging (for table scans).
    fn query_gid_quiet(&self, port: u8, index: u8) -> Option<Gid> {
        // SAFETY: as in query_gid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_gid(self.as_ptr(), port, index as i32, &mut gid) };
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        (rc == 0).then_some(Gid(unsafe { gid.raw }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: all children hold an Arc<Context>, so none is alive; closed exactly once.
        let rc = unsafe { ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_close_device",
                format_args!("{}", self.name),
                last_errno(),
                CallKind::Control,
            );
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}
