//! UCX status codes, with UCX's numbers and meanings.
//!
//! `Status` is the value the C-ABI plugin boundary returns (as an `i8`) and what completions
//! report. The APIs return [`crate::Result`], whose error ([`crate::Error`]) carries an error
//! status, and [`crate::Outcome`] for `Ok`/`InProgress`.

use std::fmt;

/// A UCX status code. The discriminants are UCX's `ucs_status_t` values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(i8)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The operation started and completes later (a request or callback reports it).
    InProgress = 1,
    /// No pending message.
    NoMessage = -1,
    /// No resource right now (send queue or credits full): progress and retry.
    NoResource = -2,
    /// Input/output error (a system call or the device failed).
    IoError = -3,
    /// Out of memory.
    NoMemory = -4,
    /// An invalid parameter (API misuse or bad input).
    InvalidParam = -5,
    /// The destination is unreachable.
    Unreachable = -6,
    /// The address is not valid (malformed, or of another transport).
    InvalidAddr = -7,
    /// The function is not implemented.
    NotImplemented = -8,
    /// The message did not fit the receive buffer; it was truncated.
    MessageTruncated = -9,
    /// No progress was made.
    NoProgress = -10,
    /// The buffer given is too small.
    BufferTooSmall = -11,
    /// No such element.
    NoElem = -12,
    /// Some of the requested endpoints failed to connect.
    SomeConnectsFailed = -13,
    /// No such device (or no usable one).
    NoDevice = -14,
    /// The resource is busy (e.g. `arm` while work waits).
    Busy = -15,
    /// The request was canceled.
    Canceled = -16,
    /// A shared-memory segment could not be created or attached.
    ShmemSegment = -17,
    /// The element already exists.
    AlreadyExists = -18,
    /// An index or address out of range.
    OutOfRange = -19,
    /// The operation timed out.
    TimedOut = -20,
    /// A configured limit was reached.
    ExceedsLimit = -21,
    /// The operation is not supported (by this transport or configuration).
    Unsupported = -22,
    /// The remote peer rejected the operation (e.g. a connection request).
    Rejected = -23,
    /// The endpoint is not connected (or its worker is gone).
    NotConnected = -24,
    /// The remote peer reset the connection.
    ConnectionReset = -25,
    /// First code of the link-failure range (a transport's link went down).
    FirstLinkFailure = -40,
    /// Last code of the link-failure range.
    LastLinkFailure = -59,
    /// First code of the endpoint-failure range (the peer failed).
    FirstEndpointFailure = -60,
    /// The endpoint timed out: the peer stopped answering.
    EndpointTimeout = -80,
    /// Last code of the endpoint-failure range.
    LastEndpointFailure = -89,
    /// The end of the error codes (no error has a lower value).
    ErrLast = -100,
}

const ALL: &[Status] = &[
    Status::Ok,
    Status::InProgress,
    Status::NoMessage,
    Status::NoResource,
    Status::IoError,
    Status::NoMemory,
    Status::InvalidParam,
    Status::Unreachable,
    Status::InvalidAddr,
    Status::NotImplemented,
    Status::MessageTruncated,
    Status::NoProgress,
    Status::BufferTooSmall,
    Status::NoElem,
    Status::SomeConnectsFailed,
    Status::NoDevice,
    Status::Busy,
    Status::Canceled,
    Status::ShmemSegment,
    Status::AlreadyExists,
    Status::OutOfRange,
    Status::TimedOut,
    Status::ExceedsLimit,
    Status::Unsupported,
    Status::Rejected,
    Status::NotConnected,
    Status::ConnectionReset,
    Status::FirstLinkFailure,
    Status::LastLinkFailure,
    Status::FirstEndpointFailure,
    Status::EndpointTimeout,
    Status::LastEndpointFailure,
    Status::ErrLast,
];

impl Status {
    /// The numeric UCX value.
    #[inline]
    pub const fn as_raw(self) -> i8 {
        self as i8
    }

    /// Converts a raw value back. Unknown values inside UCX's link-failure and endpoint-failure
    /// ranges map to the first code of that range; anything else unknown maps to `IoError` so a
    /// hostile or buggy peer value never becomes "success".
    pub fn from_raw(raw: i8) -> Status {
        if let Some(s) = ALL.iter().copied().find(|s| s.as_raw() == raw) {
            return s;
        }
        match raw {
            -59..=-40 => Status::FirstLinkFailure,
            -89..=-60 => Status::FirstEndpointFailure,
            _ => Status::IoError,
        }
    }

    /// True for `Ok` and `InProgress`.
    #[inline]
    pub const fn is_ok_or_inprogress(self) -> bool {
        (self as i8) >= 0
    }

    /// True for error codes (negative values).
    #[inline]
    pub const fn is_err(self) -> bool {
        (self as i8) < 0
    }

    /// UCX's symbolic name, e.g. `UCS_ERR_NO_RESOURCE`.
    pub const fn name(self) -> &'static str {
        use Status::*;
        match self {
            Ok => "UCS_OK",
            InProgress => "UCS_INPROGRESS",
            NoMessage => "UCS_ERR_NO_MESSAGE",
            NoResource => "UCS_ERR_NO_RESOURCE",
            IoError => "UCS_ERR_IO_ERROR",
            NoMemory => "UCS_ERR_NO_MEMORY",
            InvalidParam => "UCS_ERR_INVALID_PARAM",
            Unreachable => "UCS_ERR_UNREACHABLE",
            InvalidAddr => "UCS_ERR_INVALID_ADDR",
            NotImplemented => "UCS_ERR_NOT_IMPLEMENTED",
            MessageTruncated => "UCS_ERR_MESSAGE_TRUNCATED",
            NoProgress => "UCS_ERR_NO_PROGRESS",
            BufferTooSmall => "UCS_ERR_BUFFER_TOO_SMALL",
            NoElem => "UCS_ERR_NO_ELEM",
            SomeConnectsFailed => "UCS_ERR_SOME_CONNECTS_FAILED",
            NoDevice => "UCS_ERR_NO_DEVICE",
            Busy => "UCS_ERR_BUSY",
            Canceled => "UCS_ERR_CANCELED",
            ShmemSegment => "UCS_ERR_SHMEM_SEGMENT",
            AlreadyExists => "UCS_ERR_ALREADY_EXISTS",
            OutOfRange => "UCS_ERR_OUT_OF_RANGE",
            TimedOut => "UCS_ERR_TIMED_OUT",
            ExceedsLimit => "UCS_ERR_EXCEEDS_LIMIT",
            Unsupported => "UCS_ERR_UNSUPPORTED",
            Rejected => "UCS_ERR_REJECTED",
            NotConnected => "UCS_ERR_NOT_CONNECTED",
            ConnectionReset => "UCS_ERR_CONNECTION_RESET",
            FirstLinkFailure => "UCS_ERR_FIRST_LINK_FAILURE",
            LastLinkFailure => "UCS_ERR_LAST_LINK_FAILURE",
            FirstEndpointFailure => "UCS_ERR_FIRST_ENDPOINT_FAILURE",
            EndpointTimeout => "UCS_ERR_ENDPOINT_TIMEOUT",
            LastEndpointFailure => "UCS_ERR_LAST_ENDPOINT_FAILURE",
            ErrLast => "UCS_ERR_LAST",
        }
    }

    /// Readable text, as `ucs_status_string()` gives it.
    pub const fn message(self) -> &'static str {
        use Status::*;
        match self {
            Ok => "Success",
            InProgress => "Operation in progress",
            NoMessage => "No pending message",
            NoResource => "No resources are available to initiate the operation",
            IoError => "Input/output error",
            NoMemory => "Out of memory",
            InvalidParam => "Invalid parameter",
            Unreachable => "Destination is unreachable",
            InvalidAddr => "Address not valid",
            NotImplemented => "Function not implemented",
            MessageTruncated => "Message truncated",
            NoProgress => "No progress",
            BufferTooSmall => "Provided buffer is too small",
            NoElem => "No such element",
            SomeConnectsFailed => "Failed to connect some of the requested endpoints",
            NoDevice => "No such device",
            Busy => "Device is busy",
            Canceled => "Request canceled",
            ShmemSegment => "Shared memory error",
            AlreadyExists => "Element already exists",
            OutOfRange => "Index out of range",
            TimedOut => "Operation timed out",
            ExceedsLimit => "User-defined limit was reached",
            Unsupported => "Unsupported operation",
            Rejected => "Operation rejected by remote peer",
            NotConnected => "Endpoint is not connected",
            ConnectionReset => "Connection reset by remote peer",
            FirstLinkFailure => "First link failure",
            LastLinkFailure => "Last link failure",
            FirstEndpointFailure => "First endpoint failure",
            EndpointTimeout => "Endpoint timeout",
            LastEndpointFailure => "Last endpoint failure",
            ErrLast => "Last error code",
        }
    }

    /// Maps an OS error number to the closest status (used by socket transports).
    pub fn from_errno(errno: i32) -> Status {
        match errno {
            libc_errno::EAGAIN => Status::NoResource,
            libc_errno::ECONNRESET | libc_errno::EPIPE | libc_errno::ECONNABORTED => Status::ConnectionReset,
            libc_errno::ECONNREFUSED => Status::Rejected,
            libc_errno::ETIMEDOUT => Status::EndpointTimeout,
            libc_errno::ENETUNREACH | libc_errno::EHOSTUNREACH => Status::Unreachable,
            libc_errno::ENOTCONN => Status::NotConnected,
            libc_errno::ENOMEM | libc_errno::ENOBUFS => Status::NoMemory,
            libc_errno::EINVAL => Status::InvalidParam,
            libc_errno::ENODEV | libc_errno::ENXIO => Status::NoDevice,
            libc_errno::EBUSY => Status::Busy,
            libc_errno::EADDRINUSE | libc_errno::EEXIST => Status::AlreadyExists,
            _ => Status::IoError,
        }
    }
}

/// The few Linux errno values `from_errno` needs (stable across Linux architectures we support).
mod libc_errno {
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENODEV: i32 = 19;
    pub const ENXIO: i32 = 6;
    pub const EINVAL: i32 = 22;
    pub const EPIPE: i32 = 32;
    pub const ENOBUFS: i32 = 105;
    pub const ECONNABORTED: i32 = 103;
    pub const ECONNRESET: i32 = 104;
    pub const ENOTCONN: i32 = 107;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTUNREACH: i32 = 113;
    pub const ENETUNREACH: i32 = 101;
    pub const EADDRINUSE: i32 = 98;
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Status {}

impl From<&std::io::Error> for Status {
    fn from(e: &std::io::Error) -> Status {
        match e.raw_os_error() {
            Some(errno) => Status::from_errno(errno),
            None => match e.kind() {
                std::io::ErrorKind::WouldBlock => Status::NoResource,
                std::io::ErrorKind::UnexpectedEof => Status::ConnectionReset,
                std::io::ErrorKind::TimedOut => Status::TimedOut,
                _ => Status::IoError,
            },
        }
    }
}

impl From<std::io::Error> for Status {
    fn from(e: std::io::Error) -> Status {
        Status::from(&e)
    }
}

impl From<nix::errno::Errno> for Status {
    fn from(e: nix::errno::Errno) -> Status {
        Status::from_errno(e as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_ucx() {
        assert_eq!(Status::NoResource.as_raw(), -2);
        assert_eq!(Status::Unsupported.as_raw(), -22);
        assert_eq!(Status::ConnectionReset.as_raw(), -25);
        assert_eq!(Status::EndpointTimeout.as_raw(), -80);
        assert_eq!(Status::Busy.as_raw(), -15);
        assert_eq!(Status::MessageTruncated.as_raw(), -9);
        assert_eq!(Status::ExceedsLimit.as_raw(), -21);
    }

    #[test]
    fn raw_round_trip() {
        for s in ALL {
            assert_eq!(Status::from_raw(s.as_raw()), *s);
        }
        assert_eq!(Status::from_raw(-45), Status::FirstLinkFailure);
        assert_eq!(Status::from_raw(-70), Status::FirstEndpointFailure);
        assert_eq!(Status::from_raw(42), Status::IoError);
        assert_eq!(Status::from_raw(-120), Status::IoError);
    }

    #[test]
    fn display_and_name() {
        assert_eq!(
            Status::NoResource.to_string(),
            "No resources are available to initiate the operation"
        );
        assert_eq!(Status::ConnectionReset.name(), "UCS_ERR_CONNECTION_RESET");
        assert!(Status::InProgress.is_ok_or_inprogress());
        assert!(Status::Canceled.is_err());
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(Status::from_errno(104), Status::ConnectionReset);
        assert_eq!(Status::from_errno(111), Status::Rejected);
        assert_eq!(
            Status::from(std::io::Error::from_raw_os_error(110)),
            Status::EndpointTimeout
        );
    }
}
