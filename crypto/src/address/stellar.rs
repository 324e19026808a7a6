//! ADDRESS_FORMAT_XLM: Stellar StrKey account ID (`G...`).
//!
//! Written out here because it is tiny (version byte, CRC16-XModem, unpadded RFC 4648 base32)
//! and the Stellar crates that provide it pull in the whole XDR stack.

/// Version byte of an Ed25519 public key ("G").
const VERSION_ACCOUNT_ID: u8 = 6 << 3;

/// CRC16-XModem: polynomial 0x1021, initial value 0, no reflection, no final XOR.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// RFC 4648 base32, uppercase, without padding.
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity((data.len() * 8).div_ceil(5));
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for &byte in data {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 0x1f) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 0x1f) as usize] as char);
    }
    out
}

pub(super) fn address(key: &[u8; 32]) -> String {
    let mut payload = [0u8; 35];
    payload[0] = VERSION_ACCOUNT_ID;
    payload[1..33].copy_from_slice(key);
    let crc = crc16_xmodem(&payload[..33]);
    payload[33..].copy_from_slice(&crc.to_le_bytes());
    base32(&payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::tests::pubkey_of;
    use crate::keys::Curve;

    #[test]
    fn rfc4648_and_crc_vectors() {
        // RFC 4648 section 10 (padding removed).
        for (input, expected) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32(input.as_bytes()), expected);
        }
        // CRC-16/XMODEM check value.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
    }

    #[test]
    fn sep_0005_test_1() {
        // SEP-0005 test 1: mnemonic -> SLIP-0010 m/44'/148'/x' -> StrKey.
        let phrase = "illness spike retreat truth genius clock brain pass fit cave bargain toe";
        for (index, expected) in [
            (0, "GDRXE2BQUC3AZNPVFSCEZ76NJ3WWL25FYFK6RGZGIEKWE4SOOHSUJUJ6"),
            (1, "GBAW5XGWORWVFE2XTJYDTLDHXTY2Q2MO73HYCGB3XMFMQ562Q2W2GJQX"),
            (9, "GBTVYYDIYWGUQUTKX6ZMLGSZGMTESJYJKJWAATGZGITA25ZB6T5REF44"),
        ] {
            let pk = pubkey_of(phrase, Curve::Ed25519, &format!("m/44'/148'/{index}'"));
            assert_eq!(crate::address::address("ADDRESS_FORMAT_XLM", Curve::Ed25519, &pk).unwrap(), expected);
        }
    }

    #[test]
    fn sep_0005_test_3_24_words() {
        let phrase = "bench hurt jump file august wise shallow faculty impulse spring exact slush thunder author capable act festival slice deposit sauce coconut afford frown better";
        let pk = pubkey_of(phrase, Curve::Ed25519, "m/44'/148'/0'");
        assert_eq!(
            crate::address::address("ADDRESS_FORMAT_XLM", Curve::Ed25519, &pk).unwrap(),
            "GC3MMSXBWHL6CPOAVERSJITX7BH76YU252WGLUOM5CJX3E7UCYZBTPJQ"
        );
    }
}
