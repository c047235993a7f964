//! `libuct_ib.so`: the `ib` transport module, loadable as a plugin.
#![forbid(unsafe_code)]

uct_transport::export_plugin!(ib, transport::module);
