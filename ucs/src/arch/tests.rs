#![allow(unsafe_code)] // calls copy_maybe_overlapping on test buffers

use super::*;

const ALL: CopyWindow = CopyWindow {
    min: 0,
    max: usize::MAX,
};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn string_copy_window_copies_every_length_and_alignment() {
    let src = pattern(70_000, 7);
    for &len in &[0usize, 1, 7, 63, 64, 65, 4095, 4096, 8000, 65_537] {
        for soff in [0usize, 1, 13] {
            for doff in [0usize, 3, 64] {
                let mut dst = vec![0xeeu8; len + doff + 8];
                copy_in(ALL, &mut dst[doff..doff + len], &src[soff..soff + len]);
                assert_eq!(
                    &dst[doff..doff + len],
                    &src[soff..soff + len],
                    "len {len} +{soff}/+{doff}"
                );
                assert!(dst[..doff].iter().all(|&b| b == 0xee), "wrote before the range");
                assert!(
                    dst[doff + len..].iter().all(|&b| b == 0xee),
                    "wrote past the range"
                );
            }
        }
    }
}

#[test]
fn window_bounds() {
    let w = CopyWindow { min: 100, max: 200 };
    assert!(!w.contains(99) && w.contains(100) && w.contains(199) && !w.contains(200));
    assert!(!CopyWindow::OFF.contains(usize::MAX - 1));
}

#[test]
fn overlapping_copies_move_like_memmove() {
    for (from, to) in [(0usize, 5usize), (5, 0), (0, 0)] {
        let mut buf = pattern(64, 1);
        let want = {
            let mut w = buf.clone();
            w.copy_within(from..from + 40, to);
            w
        };
        // SAFETY: both ranges lie inside `buf`, which nothing else accesses.
        unsafe { copy_maybe_overlapping(buf.as_ptr().add(from), buf.as_mut_ptr().add(to), 40) };
        assert_eq!(buf, want, "{from} -> {to}");
    }
}

#[test]
fn disjoint_copy_through_the_window_in_effect() {
    let src = pattern(3 << 20, 9);
    let mut dst = vec![0u8; src.len()];
    // SAFETY: two distinct vectors of the copied length.
    unsafe { copy_maybe_overlapping(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
    assert_eq!(dst, src);
}

static TEST_TABLE: ConfigTable = ConfigTable {
    name: "archtest",
    prefix: "ARCHTEST_",
    fields: ARCH_TABLE.fields,
};

#[test]
fn window_from_environment() {
    let auto = CopyWindow {
        min: 1 << 20,
        max: usize::MAX,
    };
    assert_eq!(read_window(&TEST_TABLE, auto), auto, "defaults are auto");
    std::env::set_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MIN", "64k");
    std::env::set_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MAX", "8m");
    assert_eq!(
        read_window(&TEST_TABLE, auto),
        CopyWindow {
            min: 64 << 10,
            max: 8 << 20
        }
    );
    std::env::set_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MIN", "inf");
    assert!(!read_window(&TEST_TABLE, auto).contains(1 << 30));
    std::env::set_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MIN", "lots");
    assert_eq!(
        read_window(&TEST_TABLE, auto),
        CopyWindow::OFF,
        "an invalid value turns it off"
    );
    std::env::remove_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MIN");
    std::env::remove_var("RUCX_ARCHTEST_BUILTIN_MEMCPY_MAX");
}

#[test]
fn auto_is_off_or_starts_at_a_cache_size() {
    let w = cpu_default();
    assert!(
        w == CopyWindow::OFF || (w.min >= 64 << 10 && w.min.is_power_of_two() && w.max == usize::MAX),
        "{w:?}"
    );
}

#[test]
fn short_copies_move_every_length_and_overlap() {
    for len in 0..=20usize {
        for (from, to) in [(0usize, 24usize), (24, 0), (0, 3), (3, 0), (5, 5)] {
            let mut buf = pattern(48, len as u8);
            let mut want = buf.clone();
            want.copy_within(from..from + len, to);
            // SAFETY: both ranges lie inside `buf` (at most 24 + 20 of 48 bytes).
            unsafe { copy_maybe_overlapping(buf.as_ptr().add(from), buf.as_mut_ptr().add(to), len) };
            assert_eq!(buf, want, "{len} bytes {from} -> {to}");
        }
    }
}
