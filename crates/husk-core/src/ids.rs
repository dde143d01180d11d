//! Ids in the UUID shape (`8-4-4-4-12` lower-case hex) that E2B's APIs use for contexts and
//! builds.

/// The first 32 hex digits of `hex` (padded with `0`) in the UUID shape.
pub fn uuid_shaped(hex: &str) -> String {
    let h: String = hex.chars().chain(std::iter::repeat('0')).take(32).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A random (version 4) UUID.
pub fn random_uuid() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Ok(uuid_shaped(&hex::encode(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuid_shaped() {
        assert_eq!(
            uuid_shaped("0123456789abcdef0123456789abcdef0123"),
            "01234567-89ab-cdef-0123-456789abcdef"
        );
        assert_eq!(uuid_shaped(""), "00000000-0000-0000-0000-000000000000");
        let (a, b) = (random_uuid().unwrap(), random_uuid().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
