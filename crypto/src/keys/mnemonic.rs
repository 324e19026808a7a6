//! BIP-39 mnemonics (bip39 crate, all word lists, zeroized on drop).
//!
//! Seeds. A BIP-39 seed is PBKDF2 over the *text* of the phrase (NFKD), so the same entropy gives
//! a different seed in each language. Coffer's choice:
//! - wallets Coffer creates derive their seed from the **English** phrase of their entropy
//!   ([`seed_from_entropy`]); exporting such a wallet in another language changes only the words
//!   shown, not the keys, and the English phrase is the one other wallets will reproduce;
//! - imported phrases derive their seed from the phrase **as given**, in whatever language it is
//!   ([`seed_from_phrase`]), which is what every other BIP-39 wallet does with that phrase. For an
//!   English phrase both functions agree.
//!
//! The empty passphrase is used throughout.

use std::borrow::Cow;

use bip39::{Language, Mnemonic};
use zeroize::{Zeroize, Zeroizing};

use crate::error::CryptoError;
use crate::secret::{Entropy, Seed};

/// Entropy length in bytes for a phrase of `words` words.
pub fn entropy_len_for_words(words: u32) -> Result<usize, CryptoError> {
    match words {
        12 => Ok(16),
        15 => Ok(20),
        18 => Ok(24),
        21 => Ok(28),
        24 => Ok(32),
        n => Err(CryptoError::invalid(format!("invalid mnemonic length: {n} (must be 12, 15, 18, 21 or 24)"))),
    }
}

/// The word list named by the wire enum `MnemonicLanguage` ("" means English).
fn language(wire: &str) -> Result<Language, CryptoError> {
    Ok(match wire {
        "" | "MNEMONIC_LANGUAGE_ENGLISH" => Language::English,
        "MNEMONIC_LANGUAGE_SIMPLIFIED_CHINESE" => Language::SimplifiedChinese,
        "MNEMONIC_LANGUAGE_TRADITIONAL_CHINESE" => Language::TraditionalChinese,
        "MNEMONIC_LANGUAGE_CZECH" => Language::Czech,
        "MNEMONIC_LANGUAGE_FRENCH" => Language::French,
        "MNEMONIC_LANGUAGE_ITALIAN" => Language::Italian,
        "MNEMONIC_LANGUAGE_JAPANESE" => Language::Japanese,
        "MNEMONIC_LANGUAGE_KOREAN" => Language::Korean,
        "MNEMONIC_LANGUAGE_SPANISH" => Language::Spanish,
        other => return Err(CryptoError::invalid(format!("invalid mnemonic language: {other}"))),
    })
}

fn mnemonic_from(language: Language, entropy: &[u8]) -> Result<Mnemonic, CryptoError> {
    Mnemonic::from_entropy_in(language, entropy).map_err(|_| {
        CryptoError::invalid(format!("invalid entropy length: {} bytes (must be 16, 20, 24, 28 or 32)", entropy.len()))
    })
}

/// The words of `m` separated by single spaces, written into one allocation of the final size so
/// no reallocated copy of the phrase is left behind.
fn render(m: &Mnemonic) -> Zeroizing<String> {
    let len = m.words().map(|w| w.len() + 1).sum::<usize>().saturating_sub(1);
    let mut s = Zeroizing::new(String::with_capacity(len));
    for (i, w) in m.words().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(w);
    }
    s
}

/// The phrase of `entropy` (16, 20, 24, 28 or 32 bytes) in `language`, a wire enum
/// `MNEMONIC_LANGUAGE_*` or "" for English. Words are separated by single ASCII spaces and
/// appear as in the bip39 crate's word lists (NFKD).
pub fn mnemonic_phrase(entropy: &Entropy, language: &str) -> Result<Zeroizing<String>, CryptoError> {
    let lang = self::language(language)?;
    let m = mnemonic_from(lang, entropy)?;
    Ok(render(&m))
}

/// Parses and checks a phrase in any supported language. Surrounding and repeated whitespace
/// (including U+3000) is ignored; the text is NFKD-normalized first.
fn parse(phrase: &str) -> Result<Mnemonic, CryptoError> {
    let invalid = || CryptoError::invalid("invalid mnemonic");

    let mut cow = Cow::Borrowed(phrase);
    Mnemonic::normalize_utf8_cow(&mut cow);
    // Keep any normalized copy in a zeroizing buffer.
    let normalized: Option<Zeroizing<String>> = match cow {
        Cow::Owned(s) => Some(Zeroizing::new(s)),
        Cow::Borrowed(_) => None,
    };
    let text: &str = normalized.as_ref().map_or(phrase, |s| s.as_str());

    match Mnemonic::language_of(text) {
        Ok(lang) => Mnemonic::parse_in_normalized(lang, text).map_err(|_| invalid()),
        // Word lists that share words (English/French, the two Chinese lists) can leave several
        // candidates: take the first, in the crate's order (English first), whose checksum holds.
        Err(bip39::Error::AmbiguousLanguages(candidates)) => {
            candidates.iter().find_map(|lang| Mnemonic::parse_in_normalized(lang, text).ok()).ok_or_else(invalid)
        }
        Err(_) => Err(invalid()),
    }
}

/// The entropy of a phrase in any supported language.
pub fn entropy_from_phrase(phrase: &str) -> Result<Entropy, CryptoError> {
    let m = parse(phrase)?;
    // Rebuilt from the word indices of the parsed mnemonic rather than with
    // `Mnemonic::to_entropy*`, which re-detects the language and so cannot cope with a phrase
    // whose words exist in two lists, and which leaves unzeroized copies.
    let words = m.word_count();
    let len = words / 3 * 4;
    let mut out = Zeroizing::new(vec![0u8; len]);
    let mut bit = 0usize;
    for mut idx in m.word_indices() {
        for j in (0..11).rev() {
            if bit < len * 8 && (idx >> j) & 1 == 1 {
                out[bit / 8] |= 0x80 >> (bit % 8);
            }
            bit += 1;
        }
        idx.zeroize();
    }
    Ok(Entropy::from(out))
}

/// The seed of `m`, copied into a [`Seed`] and wiped where the bip39 crate returned it.
fn seed_of(m: &Mnemonic) -> Seed {
    let mut bytes = m.to_seed_normalized("");
    let seed = Seed::from_slice(&bytes);
    bytes.zeroize();
    seed
}

/// The BIP-39 seed (empty passphrase) of the **English** phrase of `entropy`.
pub fn seed_from_entropy(entropy: &Entropy) -> Result<Seed, CryptoError> {
    let m = mnemonic_from(Language::English, entropy)?;
    Ok(seed_of(&m))
}

/// The BIP-39 seed (empty passphrase) of a phrase in any supported language, computed from the
/// phrase as given (normalized: NFKD, single spaces), after checking its words and checksum.
pub fn seed_from_phrase(phrase: &str) -> Result<Seed, CryptoError> {
    let m = parse(phrase)?;
    Ok(seed_of(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABANDON: &str =
        "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about";
    const LANGUAGES: [&str; 10] = [
        "",
        "MNEMONIC_LANGUAGE_ENGLISH",
        "MNEMONIC_LANGUAGE_SIMPLIFIED_CHINESE",
        "MNEMONIC_LANGUAGE_TRADITIONAL_CHINESE",
        "MNEMONIC_LANGUAGE_CZECH",
        "MNEMONIC_LANGUAGE_FRENCH",
        "MNEMONIC_LANGUAGE_ITALIAN",
        "MNEMONIC_LANGUAGE_JAPANESE",
        "MNEMONIC_LANGUAGE_KOREAN",
        "MNEMONIC_LANGUAGE_SPANISH",
    ];

    fn ent(bytes: &[u8]) -> Entropy {
        Entropy::from_slice(bytes)
    }

    fn msg(e: CryptoError) -> String {
        match e {
            CryptoError::InvalidArgument(m) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn entropy_lengths() {
        for (words, bytes) in [(12, 16), (15, 20), (18, 24), (21, 28), (24, 32)] {
            assert_eq!(entropy_len_for_words(words).unwrap(), bytes);
            let entropy = vec![0x5au8; bytes];
            let phrase = mnemonic_phrase(&ent(&entropy), "").unwrap();
            assert_eq!(phrase.split(' ').count(), words as usize);
        }
        for bad in [0, 11, 13, 16, 25, 48] {
            assert_eq!(
                msg(entropy_len_for_words(bad).unwrap_err()),
                format!("invalid mnemonic length: {bad} (must be 12, 15, 18, 21 or 24)")
            );
        }
        assert!(mnemonic_phrase(&ent(&[0u8; 17]), "").is_err());
        assert!(seed_from_entropy(&ent(&[0u8; 12])).is_err());
    }

    #[test]
    fn bip39_vectors() {
        // BIP-39 / Trezor vector 0 entropy, seed with the empty passphrase (widely published).
        let phrase = mnemonic_phrase(&ent(&[0u8; 16]), "MNEMONIC_LANGUAGE_ENGLISH").unwrap();
        assert_eq!(phrase.as_str(), ABANDON);
        let seed = seed_from_entropy(&ent(&[0u8; 16])).unwrap();
        assert_eq!(
            hex::encode(seed.as_bytes()),
            "5eb00bbddcf069084889a8ab9155568165f5c453ccb85e70811aaed6f6da5fc1\
             9a5ac40b389cd370d086206dec8aa6c43daea6690f20ad3d8d48b2d2ce9e38e4"
        );
        assert_eq!(*seed_from_phrase(ABANDON).unwrap(), *seed);
        // Trezor vector: 7f7f...7f.
        assert_eq!(
            mnemonic_phrase(&ent(&[0x7f; 16]), "").unwrap().as_str(),
            "legal winner thank year wave sausage worth useful legal winner thank yellow"
        );
        // SEP-0005 test 1: phrase -> seed.
        assert_eq!(
            hex::encode(
                seed_from_phrase("illness spike retreat truth genius clock brain pass fit cave bargain toe")
                    .unwrap()
                    .as_bytes()
            ),
            "e4a5a632e70943ae7f07659df1332160937fad82587216a4c64315a0fb39497e\
             e4a01f76ddab4cba68147977f3a147b6ad584c41808e8238a07f6cc4b582f186"
        );
    }

    #[test]
    fn phrase_whitespace_is_normalized() {
        let messy = format!("  {}\n", ABANDON.replace(' ', " \t "));
        assert_eq!(entropy_from_phrase(&messy).unwrap().as_bytes(), &[0u8; 16]);
        assert_eq!(*seed_from_phrase(&messy).unwrap(), *seed_from_phrase(ABANDON).unwrap());
    }

    #[test]
    fn every_language_round_trips() {
        let entropy: Vec<u8> = (0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
        for lang in LANGUAGES {
            for len in [16, 20, 24, 28, 32] {
                let phrase = mnemonic_phrase(&ent(&entropy[..len]), lang).unwrap();
                assert_eq!(phrase.split(' ').count(), len * 3 / 4, "{lang}");
                assert_eq!(entropy_from_phrase(&phrase).unwrap().as_bytes(), &entropy[..len], "{lang}");
                // Seed of the phrase as given; for English this equals the entropy's seed.
                let from_phrase = seed_from_phrase(&phrase).unwrap();
                let from_entropy = seed_from_entropy(&ent(&entropy[..len])).unwrap();
                assert_eq!(
                    *from_phrase == *from_entropy,
                    lang.is_empty() || lang == "MNEMONIC_LANGUAGE_ENGLISH",
                    "{lang}"
                );
            }
        }
        // Japanese with the ideographic space (U+3000) BIP-39 recommends for display.
        let ja = mnemonic_phrase(&ent(&entropy[..16]), "MNEMONIC_LANGUAGE_JAPANESE").unwrap();
        let ja_ideographic = ja.replace(' ', "\u{3000}");
        assert_eq!(entropy_from_phrase(&ja_ideographic).unwrap().as_bytes(), &entropy[..16]);
        assert_eq!(*seed_from_phrase(&ja_ideographic).unwrap(), *seed_from_phrase(&ja).unwrap());
    }

    #[test]
    fn ambiguous_word_lists_prefer_a_valid_reading() {
        // "abandon ... about": every word is in both the English and the French list.
        assert_eq!(entropy_from_phrase(ABANDON).unwrap().as_bytes(), &[0u8; 16]);
        // A Chinese phrase whose characters occur in both Chinese lists still round-trips.
        for e in 0u8..=255 {
            let entropy = [e; 16];
            let phrase = mnemonic_phrase(&ent(&entropy), "MNEMONIC_LANGUAGE_TRADITIONAL_CHINESE").unwrap();
            let back = entropy_from_phrase(&phrase).unwrap();
            // The phrase decodes to its own entropy unless it also reads as a valid
            // Simplified Chinese phrase, in which case that (first) reading wins.
            if back.as_bytes() != entropy {
                let simplified = mnemonic_phrase(&back, "MNEMONIC_LANGUAGE_SIMPLIFIED_CHINESE").unwrap();
                assert_eq!(simplified.as_str(), phrase.as_str());
            }
        }
    }

    #[test]
    fn bad_phrases_and_languages_are_refused() {
        for bad in [
            "",
            "   ",
            "abandon",
            // Bad checksum.
            "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon",
            // Unknown word.
            "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abcdef",
            // 13 words.
            "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about",
        ] {
            assert_eq!(msg(entropy_from_phrase(bad).unwrap_err()), "invalid mnemonic");
            assert_eq!(msg(seed_from_phrase(bad).unwrap_err()), "invalid mnemonic");
        }
        assert_eq!(
            msg(mnemonic_phrase(&ent(&[0u8; 16]), "MNEMONIC_LANGUAGE_KLINGON").unwrap_err()),
            "invalid mnemonic language: MNEMONIC_LANGUAGE_KLINGON"
        );
        assert_eq!(
            msg(mnemonic_phrase(&ent(&[0u8; 15]), "").unwrap_err()),
            "invalid entropy length: 15 bytes (must be 16, 20, 24, 28 or 32)"
        );
    }
}
