//! Just enough CBOR encoding to build attestation objects and COSE keys in tests and fuzz seeds
//! (definite lengths below 2^16). The parser under test is coffer-auth's; this only writes.

/// A CBOR value: integers, byte and text strings, maps.
pub enum Cbor {
    Int(i64),
    Bytes(Vec<u8>),
    Text(&'static str),
    Map(Vec<(Cbor, Cbor)>),
}

/// Appends the encoding of `v` to `out`.
pub fn cbor(v: &Cbor, out: &mut Vec<u8>) {
    fn head(major: u8, n: u64, out: &mut Vec<u8>) {
        match n {
            0..=23 => out.push(major << 5 | n as u8),
            24..=0xff => out.extend_from_slice(&[major << 5 | 24, n as u8]),
            _ => {
                out.push(major << 5 | 25);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
    }
    match v {
        Cbor::Int(i) if *i >= 0 => head(0, *i as u64, out),
        Cbor::Int(i) => head(1, (-1 - *i) as u64, out),
        Cbor::Bytes(b) => {
            head(2, b.len() as u64, out);
            out.extend_from_slice(b);
        }
        Cbor::Text(t) => {
            head(3, t.len() as u64, out);
            out.extend_from_slice(t.as_bytes());
        }
        Cbor::Map(m) => {
            head(5, m.len() as u64, out);
            for (k, v) in m {
                cbor(k, out);
                cbor(v, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_rfc_8949_examples() {
        let enc = |v: Cbor| {
            let mut out = Vec::new();
            cbor(&v, &mut out);
            hex::encode(out)
        };
        assert_eq!(enc(Cbor::Int(10)), "0a");
        assert_eq!(enc(Cbor::Int(-7)), "26");
        assert_eq!(enc(Cbor::Int(500)), "1901f4");
        assert_eq!(enc(Cbor::Text("a")), "6161");
        assert_eq!(enc(Cbor::Map(vec![(Cbor::Int(1), Cbor::Bytes(vec![2]))])), "a1014102");
    }
}
