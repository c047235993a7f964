//! uct
