//! Authorizations as signed and as policies see them: the attacks of issue 39.

use super::*;

/// Evaluates `condition` over `facts` as `eth.eip_7702_authorization`.
fn policy(facts: &Val, condition: &str) -> Result<bool, String> {
    let eth = BTreeMap::from([("eip_7702_authorization".to_string(), facts.clone())]);
    let roots = BTreeMap::from([("eth".to_string(), Val::Map(eth))]);
    let expr = coffer_policy::parse_condition(condition).map_err(|e| format!("does not parse: {e}"))?;
    coffer_policy::eval::eval_bool(&expr, &roots).map_err(|e| e.message)
}

const DENIED: &str = "0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1";

#[test]
fn a_denied_delegate_in_uppercase_hex_is_still_the_denied_delegate() {
    // Issue 39: the facts were the raw JSON, so `0xB91AAA…` passed a DENY on `0xb91aaa…` and
    // was signed (the signer decodes both to the same 20 bytes).
    let deny = format!("eth.eip_7702_authorization.address == '{DENIED}'");
    for written in [DENIED.to_string(), DENIED.to_uppercase().replacen("0X", "0x", 1), format!("0X{}", &DENIED[2..])] {
        for key in ["address", "contractAddress"] {
            let a = Authorization::parse(&format!(r#"{{"{key}":"{written}","chainId":1,"nonce":0}}"#)).unwrap();
            assert_eq!(
                a.facts(),
                Authorization::parse(&format!(r#"{{"address":"{DENIED}","chainId":1,"nonce":0}}"#)).unwrap().facts()
            );
            assert_eq!(policy(&a.facts(), &deny), Ok(true), "{written}");
        }
    }
}

#[test]
fn chain_id_and_nonce_are_numbers_however_they_are_written() {
    // Issue 39: `chainId: "0x0"` passed a rule `chain_id == 0`, which saw the string "0x0".
    for chain in [r#""0x0""#, r#""0""#, "0", r#""0x00""#] {
        let a = Authorization::parse(&format!(r#"{{"address":"{DENIED}","chainId":{chain},"nonce":"0x7"}}"#)).unwrap();
        assert_eq!(policy(&a.facts(), "eth.eip_7702_authorization.chain_id == 0"), Ok(true), "{chain}");
        assert_eq!(policy(&a.facts(), "eth.eip_7702_authorization.nonce == 7"), Ok(true), "{chain}");
    }
    let a = Authorization::parse(&format!(r#"{{"address":"{DENIED}","chainId":"0x2105","nonce":7}}"#)).unwrap();
    assert_eq!(policy(&a.facts(), "eth.eip_7702_authorization.chain_id == 8453"), Ok(true));
    // A chain id past i128 is still a number.
    let max = format!("0x{}", "f".repeat(64));
    let a = Authorization::parse(&format!(r#"{{"address":"{DENIED}","chainId":"{max}","nonce":0}}"#)).unwrap();
    assert_eq!(policy(&a.facts(), "eth.eip_7702_authorization.chain_id > 1"), Ok(true));
}

#[test]
fn an_authorization_is_bounded_before_it_is_read() {
    let padded = format!(r#"{{"address":"{DENIED}","chainId":1,"nonce":0{}}}"#, " ".repeat(MAX_AUTHORIZATION_BYTES));
    let err = Authorization::parse(&padded).unwrap_err().0;
    assert_eq!(err, format!("an authorization is at most 4096 bytes of JSON, this one is {}", padded.len()));
    for (bad, why) in [
        (r#"{"address":"0x12","chainId":1,"nonce":0}"#, "address"),
        (r#"{"address":"0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1","chainId":-1,"nonce":0}"#, "chainId"),
        (
            r#"{"address":"0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1","chainId":1,"nonce":"0x1ffffffffffffffff"}"#,
            "nonce",
        ),
    ] {
        assert!(Authorization::parse(bad).unwrap_err().0.starts_with(why), "{bad}");
    }
}
