//! JSON text read eight bytes at a time: one `u64` word, and masks of the bytes in it that
//! match. Shared by the writer's escape check (`out.rs`) and the params' string scan
//! (`json.rs`).

/// One in every byte.
const ONES: u64 = 0x0101_0101_0101_0101;
/// The high bit of every byte.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The first eight bytes of `bytes` (at least eight) as a little-endian word.
pub(super) fn word(bytes: &[u8]) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

/// The high bit of each byte of `w` below `n` (at most 0x80). The lowest bit set marks
/// exactly the first such byte (a borrow only runs upward from one); those above it may
/// be marked falsely.
pub(super) const fn below(w: u64, n: u8) -> u64 {
    w.wrapping_sub(ONES * n as u64) & !w & HIGH
}

/// The high bit of each byte of `w` equal to `b`, as [`below`] marks them.
pub(super) const fn equal(w: u64, b: u8) -> u64 {
    below(w ^ (ONES * b as u64), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_mark_is_the_first_matching_byte() {
        for at in 0..8 {
            for (b, n) in [(0x00, 0x20), (0x1f, 0x20), (b'"', 0x23)] {
                let mut bytes = [b'y'; 8];
                bytes[at] = b;
                let w = word(&bytes);
                assert_eq!(
                    below(w, n).trailing_zeros() / 8,
                    at as u32,
                    "{b:#x} at {at}"
                );
                assert_eq!(
                    equal(w, b).trailing_zeros() / 8,
                    at as u32,
                    "{b:#x} at {at}"
                );
            }
            let mut bytes = [b' '; 8];
            bytes[at] = 0x80 | b'"';
            assert_eq!(below(word(&bytes), 0x20) | equal(word(&bytes), b'"'), 0);
        }
    }
}
