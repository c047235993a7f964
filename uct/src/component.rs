//! Components, memory domains and rkeys as the application sees them.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::marker::PhantomData;
use std::rc::Rc;

use ucs::config::Overrides;
use ucs::{Error, Result, Status};

use crate::host::check;

use uct_transport::abi::{RawComponent, RawConfigPair, RawMdResource, RawTransport};
use uct_transport::types::{MdAttr, MemAccess, TlResource};

/// A component of a loaded module. `'static`: modules are never unloaded.
#[derive(Clone, Copy)]
pub struct Component {
    pub(crate) raw: &'static RawComponent,
    pub(crate) module: &'static str,
}

// SAFETY: a component is an immutable 'static table of functions.
unsafe impl Send for Component {}
// SAFETY: as above.
unsafe impl Sync for Component {}

pub(crate) fn cstr(p: *const std::ffi::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: descriptors hold 'static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

impl Component {
    /// The component name, e.g. `tcp`, `self`, `ib`.
    pub fn name(&self) -> &'static str {
        cstr(self.raw.name)
    }

    /// The module that provided it.
    pub fn module(&self) -> &'static str {
        self.module
    }

    /// Names of its memory domains.
    pub fn md_resources(&self) -> Result<Vec<String>> {
        let mut buf = vec![RawMdResource::default(); 16];
        loop {
            let mut count = 0usize;
            // SAFETY: `buf` has `buf.len()` entries; `count` is a valid out-pointer.
            let st = unsafe { (self.raw.query_md_resources)(buf.as_mut_ptr(), buf.len(), &mut count) };
            check(st)?;
            if count <= buf.len() {
                return Ok(buf[..count].iter().map(|n| n.as_str().to_owned()).collect());
            }
            buf.resize(count, RawMdResource::default());
        }
    }

    /// Names of its transports.
    pub fn transport_names(&self) -> Vec<&'static str> {
        self.transports().iter().map(|t| cstr(t.name)).collect()
    }

    pub(crate) fn transports(&self) -> &'static [RawTransport] {
        if self.raw.num_transports == 0 {
            return &[];
        }
        // SAFETY: the descriptor points to `num_transports` 'static entries.
        unsafe { std::slice::from_raw_parts(self.raw.transports, self.raw.num_transports) }
    }

    /// Opens memory domain `name` (configured by the environment only).
    pub fn md_open(&self, name: &str) -> Result<Md> {
        self.md_open_with(name, &Overrides::new())
    }

    /// Opens memory domain `name` with `config` (set in code) on top of the environment, for
    /// it and the interfaces opened on it.
    pub fn md_open_with(&self, name: &str, config: &Overrides) -> Result<Md> {
        let c = CString::new(name).map_err(|_| {
            Error::new(
                Status::InvalidParam,
                format!("memory domain name {name:?} contains a NUL"),
            )
        })?;
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid string and out-pointer.
        ucs::config::check_known(config)?;
        let pairs: Vec<RawConfigPair> = config.iter().map(|(k, v)| RawConfigPair::new(k, v)).collect();
        let st = unsafe { (self.raw.md_open)(c.as_ptr(), pairs.as_ptr(), pairs.len(), &mut h) };
        check(st)
            .map_err(|e| e.context_with(format_args!("opening memory domain {name} of {}", self.name())))?;
        let mut attr = MdAttr::default();
        // SAFETY: `h` is a fresh md handle of this component.
        let st = unsafe { ((*self.raw.md_ops).query)(h, &mut attr) };
        let md = Md {
            inner: Rc::new(MdInner {
                handle: h,
                comp: *self,
                name: name.to_owned(),
                attr,
                config: config.clone(),
            }),
        };
        check(st)?;
        Ok(md)
    }

    /// Unpacks an rkey packed by a peer's memory domain of this component.
    pub fn rkey_unpack(&self, packed: &[u8]) -> Result<Rkey> {
        let mut rkey = 0u64;
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid buffer and out-pointers.
        let st = unsafe { (self.raw.rkey_unpack)(packed.as_ptr(), packed.len(), &mut rkey, &mut handle) };
        check(st).map_err(|e| e.context_with(format_args!("unpacking a {} rkey", self.name())))?;
        Ok(Rkey {
            rkey,
            handle,
            comp: *self,
            _not_send: PhantomData,
        })
    }
}

impl std::fmt::Debug for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Component({} from {})", self.name(), self.module)
    }
}

pub(crate) struct MdInner {
    pub(crate) handle: *mut c_void,
    pub(crate) comp: Component,
    name: String,
    attr: MdAttr,
    /// The context's configuration set in code, for the interfaces opened on it.
    pub(crate) config: Overrides,
}

impl Drop for MdInner {
    fn drop(&mut self) {
        // SAFETY: every iface and registration holds an Rc to us, so none is left.
        unsafe { ((*self.comp.raw.md_ops).close)(self.handle) }
    }
}

/// An open memory domain. Clones share it; closed when the last user is gone.
#[derive(Clone)]
pub struct Md {
    pub(crate) inner: Rc<MdInner>,
}

impl Md {
    /// True when both are the same open memory domain.
    pub fn same(&self, other: &Md) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// The memory domain's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its component.
    pub fn component(&self) -> Component {
        self.inner.comp
    }

    /// Its attributes.
    pub fn attr(&self) -> &MdAttr {
        &self.inner.attr
    }

    /// Transport resources (transport × device) available on this memory domain.
    pub fn tl_resources(&self) -> Result<Vec<TlResource>> {
        let mut all = Vec::new();
        for t in self.inner.comp.transports() {
            let mut buf = vec![TlResource::default(); 32];
            loop {
                let mut count = 0usize;
                // SAFETY: valid md handle of this component, buffer and out-pointer.
                let st =
                    unsafe { (t.query_devices)(self.inner.handle, buf.as_mut_ptr(), buf.len(), &mut count) };
                if let Err(e) = check(st) {
                    ucs::warn!(tl = super::component::cstr(t.name), "cannot query devices: {e}");
                    break;
                }
                if count <= buf.len() {
                    all.extend_from_slice(&buf[..count]);
                    break;
                }
                buf.resize(count, TlResource::default());
            }
        }
        Ok(all)
    }

    pub(crate) fn transport(&self, tl_name: &str) -> Option<&'static RawTransport> {
        self.inner
            .comp
            .transports()
            .iter()
            .find(|t| cstr(t.name) == tl_name)
    }

    pub(crate) fn mem_reg_raw(&self, addr: *mut u8, len: usize, access: MemAccess) -> Result<*mut c_void> {
        let mut memh: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller owns `[addr, addr+len)` and keeps it until `mem_dereg_raw`.
        let st = unsafe {
            ((*self.inner.comp.raw.md_ops).mem_reg)(self.inner.handle, addr, len, access.0, &mut memh)
        };
        check(st)?;
        Ok(memh)
    }

    pub(crate) fn mem_dereg_raw(&self, memh: *mut c_void) -> Result<()> {
        // SAFETY: `memh` came from `mem_reg_raw` on this md.
        let st = unsafe { ((*self.inner.comp.raw.md_ops).mem_dereg)(self.inner.handle, memh) };
        check(st)
    }

    pub(crate) fn mkey_pack_raw(&self, memh: *mut c_void) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.inner.attr.rkey_packed_size];
        // SAFETY: `buf` has the size the md asked for.
        let st = unsafe {
            ((*self.inner.comp.raw.md_ops).mkey_pack)(self.inner.handle, memh, buf.as_mut_ptr(), buf.len())
        };
        check(st)?;
        Ok(buf)
    }
}

impl std::fmt::Debug for Md {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Md({}/{})", self.inner.comp.name(), self.inner.name)
    }
}

/// An unpacked remote key; released when dropped.
pub struct Rkey {
    pub(crate) rkey: u64,
    handle: *mut c_void,
    comp: Component,
    _not_send: PhantomData<*const ()>,
}

impl Rkey {
    /// The value transports use.
    pub fn raw(&self) -> u64 {
        self.rkey
    }
}

impl Drop for Rkey {
    fn drop(&mut self) {
        // SAFETY: releasing what `rkey_unpack` of this component returned, once.
        unsafe { (self.comp.raw.rkey_release)(self.rkey, self.handle) }
    }
}

impl std::fmt::Debug for Rkey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rkey({:#x})", self.rkey)
    }
}
