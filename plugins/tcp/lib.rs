//! `libuct_tcp.so`: the `tcp` transport module, loadable as a plugin.
#![forbid(unsafe_code)]

uct_transport::export_plugin!(tcp, transport::module);
