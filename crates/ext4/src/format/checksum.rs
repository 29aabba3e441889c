//! Checksums: ext4's crc32c (the kernel's raw `crc32c(seed, ...)`, with no
//! pre- or post-inversion) and the crc16 of `uninit_bg`/`gdt_csum`.

/// The kernel's `ext4_chksum(seed, data)`: the CRC-32C register advanced over
/// `data` from `seed`, without the inversions of the standard CRC.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    // crc32c_append inverts on entry and exit; undo both.
    !crc32c::crc32c_append(!seed, data)
}

/// CRC-16 (ANSI, reflected polynomial 0xA001), as the kernel's `crc16`.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The standard CRC-32C of "123456789" is 0xE3069283; the raw
        // register form is its complement from seed !0.
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn crc16_check_value() {
        // CRC-16/ARC of "123456789" is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
