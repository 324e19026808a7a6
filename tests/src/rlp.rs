//! A minimal RLP encoder and splitter for the tests, written here so that checks of signed
//! Ethereum transactions do not share the implementation's decoder (alloy).

pub fn rlp_len(len: usize, offset: u8) -> Vec<u8> {
    if len < 56 {
        return vec![offset + len as u8];
    }
    let be: Vec<u8> = len.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
    let mut out = vec![offset + 55 + be.len() as u8];
    out.extend(be);
    out
}

pub fn rlp_bytes(b: &[u8]) -> Vec<u8> {
    if b.len() == 1 && b[0] < 0x80 {
        return b.to_vec();
    }
    let mut out = rlp_len(b.len(), 0x80);
    out.extend_from_slice(b);
    out
}

pub fn rlp_uint(v: u128) -> Vec<u8> {
    let be: Vec<u8> = v.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
    rlp_bytes(&be)
}

pub fn rlp_list(items: &[Vec<u8>]) -> Vec<u8> {
    let payload = items.concat();
    let mut out = rlp_len(payload.len(), 0xc0);
    out.extend(payload);
    out
}

/// (header length, payload length) of the RLP item at the start of `b`.
pub fn rlp_header(b: &[u8]) -> (usize, usize) {
    let be = |n: usize| b[1..1 + n].iter().fold(0usize, |a, x| a << 8 | usize::from(*x));
    match b[0] {
        0x00..=0x7f => (0, 1),
        x @ 0x80..=0xb7 => (1, usize::from(x - 0x80)),
        x @ 0xb8..=0xbf => (1 + usize::from(x - 0xb7), be(usize::from(x - 0xb7))),
        x @ 0xc0..=0xf7 => (1, usize::from(x - 0xc0)),
        x => (1 + usize::from(x - 0xf7), be(usize::from(x - 0xf7))),
    }
}

/// The encoded items of a top-level list.
pub fn rlp_items(list: &[u8]) -> Vec<Vec<u8>> {
    let (h, len) = rlp_header(list);
    assert_eq!(h + len, list.len(), "one list, nothing after it");
    let mut rest = &list[h..];
    let mut items = Vec::new();
    while !rest.is_empty() {
        let (h, len) = rlp_header(rest);
        items.push(rest[..h + len].to_vec());
        rest = &rest[h + len..];
    }
    items
}

pub fn rlp_payload(item: &[u8]) -> Vec<u8> {
    let (h, len) = rlp_header(item);
    item[h..h + len].to_vec()
}

/// An unsigned EIP-1559 transaction on chain 1 (fees fixed, no access list).
pub fn eip1559(nonce: u64, to: &str, value: u128, data: &[u8]) -> Vec<u8> {
    eip1559_value(nonce, to, rlp_uint(value), data)
}

/// [`eip1559`] with its value already RLP-encoded (a value no `u128` holds).
pub fn eip1559_value(nonce: u64, to: &str, value: Vec<u8>, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x02];
    out.extend(rlp_list(&[
        rlp_uint(1),
        rlp_uint(nonce.into()),
        rlp_uint(1_000_000_000),
        rlp_uint(30_000_000_000),
        rlp_uint(100_000),
        rlp_bytes(&hex::decode(to.trim_start_matches("0x")).unwrap()),
        value,
        rlp_bytes(data),
        rlp_list(&[]),
    ]));
    out
}

/// ERC-20 `transfer(address,uint256)` call data.
pub fn erc20_transfer(to: &str, amount: u64) -> Vec<u8> {
    let mut data = hex::decode("a9059cbb").unwrap();
    data.extend([0u8; 12]);
    data.extend(hex::decode(to.trim_start_matches("0x")).unwrap());
    data.extend([0u8; 24]);
    data.extend(amount.to_be_bytes());
    data
}
