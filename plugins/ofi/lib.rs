//! `libuct_ofi.so`: the `ofi` transport module (libfabric), loadable as a plugin.
#![forbid(unsafe_code)]

uct_transport::export_plugin!(ofi, transport::module);
