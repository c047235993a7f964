//! The protocol layer (UCP): workers, wireup, lane selection and protocols over `uct` (the UCP
//! issues fill it).
#![forbid(unsafe_code)]
