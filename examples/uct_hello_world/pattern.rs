//! The test message: printable letters from a hash of the byte index (not periodic, so a
//! repeated or dropped chunk shows up) and a final NUL, as UCX ends its test string with one.
//! The receiver can therefore check any message without knowing the sender's `-s`: a
//! truncated message lacks the NUL at its end, a longer one has letters after it.

const LETTERS: &[u8; 52] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn letter(i: usize) -> u8 {
    // splitmix64 finaliser: cheap, well mixed.
    let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    LETTERS[(z % 52) as usize]
}

/// The `len`-byte message (`len >= 1`).
pub fn message(len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len).map(letter).collect();
    if let Some(last) = m.last_mut() {
        *last = 0;
    }
    m
}

/// Checks a received message; `Err` says where it first differs.
pub fn check(data: &[u8]) -> Result<(), String> {
    let Some(nul) = data.iter().position(|&b| b == 0) else {
        return Err(format!(
            "{} bytes without the final NUL: truncated or corrupted",
            data.len()
        ));
    };
    if nul + 1 != data.len() {
        return Err(format!(
            "NUL at byte {nul} of {}: corrupted or extra data",
            data.len()
        ));
    }
    match data[..nul].iter().enumerate().find(|&(i, &b)| b != letter(i)) {
        Some((i, &b)) => Err(format!("byte {i} is {b:#04x}, expected {:#04x}", letter(i))),
        None => Ok(()),
    }
}

/// The first bytes as text, for printing (UCX prints the whole string).
pub fn preview(data: &[u8]) -> String {
    const MAX: usize = 64;
    let text: String = data
        .iter()
        .take_while(|&&b| b != 0)
        .take(MAX)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
        .collect();
    let more = data.iter().take_while(|&&b| b != 0).count() > MAX;
    format!("\"{text}{}\"", if more { "..." } else { "" })
}
