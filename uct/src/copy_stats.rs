//! How many bytes this thread's AM handlers copied out of shared memory (feature
//! `copy-stats`): lets a test check that a receive path copies a message once, to where it
//! goes, rather than first into a staging buffer.
//!
//! ```
//! let before = uct::copy_stats::take();
//! assert_eq!(before, uct::copy_stats::CopyStats::default());
//! ```

use std::cell::Cell;

/// Counts since the last [`take`] on this thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Bytes read out of messages in shared memory, wherever they went.
    pub from_shared: u64,
    /// Of those, bytes [`crate::AmMessage::data`] staged in the handler's own buffer (the
    /// slice it returns): a second copy follows when the handler copies that slice on.
    pub staged: u64,
    /// Messages in shared memory that were read at all.
    pub messages: u64,
}

thread_local! {
    static STATS: Cell<CopyStats> = const { Cell::new(CopyStats { from_shared: 0, staged: 0, messages: 0 }) };
}

/// The counts since the last call on this thread; resets them.
pub fn take() -> CopyStats {
    STATS.with(|s| s.replace(CopyStats::default()))
}

/// The counts since the last [`take`] on this thread, left as they are.
pub fn peek() -> CopyStats {
    STATS.with(|s| s.get())
}

pub(crate) fn copied(bytes: usize, first: bool) {
    STATS.with(|s| {
        let mut c = s.get();
        c.from_shared += bytes as u64;
        c.messages += u64::from(first);
        s.set(c);
    });
}

pub(crate) fn staged(bytes: usize) {
    STATS.with(|s| {
        let mut c = s.get();
        c.staged += bytes as u64;
        s.set(c);
    });
}
