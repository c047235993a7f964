//! `libuct_self.so`: the `self` transport module, loadable as a plugin.
#![forbid(unsafe_code)]

uct_transport::export_plugin!(self, transport::module);
