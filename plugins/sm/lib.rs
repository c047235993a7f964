//! `libuct_sm.so`: the shared-memory transport module (posix, sysv, cma), loadable as a plugin.
#![forbid(unsafe_code)]

uct_transport::export_plugin!(sm, transport::module);
