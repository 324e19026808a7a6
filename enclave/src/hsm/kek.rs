//! AES-GCM under the KEK in the HSM, with the IV produced the way the module's profile says:
//! passed in by Coffer, written back by the module, appended or prepended to the output by it,
//! or generated through the PKCS#11 3.0 message API.

use cryptoki::error::Error as CkError;
use cryptoki::mechanism::aead::{GcmMessageParams, GeneratorFunction};
use cryptoki::mechanism::vendor_defined::VendorDefinedMechanism;
use cryptoki::mechanism::{Mechanism, MessageParam};
use cryptoki::object::ObjectHandle;
use cryptoki::session::Session;
use cryptoki_sys::{CK_GCM_PARAMS, CK_ULONG};

use super::profile::{IvSource, ModuleProfile};
use super::seal::TAG_BITS;

const TAG_LEN: usize = TAG_BITS / 8;

/// What one seal produced: the IV the GCM operation used and ciphertext ‖ tag.
pub(super) struct GcmOutput {
    pub iv: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// Why a module's GCM output cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GcmFault {
    /// The profile says the module writes its IV back, and the buffer is still zero.
    NoIvWrittenBack,
    /// The output is too short to hold the IV the profile says it carries, and a tag.
    ShortOutput,
}

/// `CK_GCM_PARAMS` as the profile's module wants them. `announced_iv_len` is `ulIvLen` (0 asks
/// an appending or prepending module for an IV of `ulIvBits`); the buffer stays `iv`'s.
fn gcm_params(iv: &mut [u8], announced_iv_len: usize, aad: &[u8]) -> CK_GCM_PARAMS {
    CK_GCM_PARAMS {
        pIv: iv.as_mut_ptr(),
        ulIvLen: announced_iv_len as CK_ULONG,
        // Luna reads ulIvBits; the 3.0 specification says ulIvLen (cryptoki sets both, too).
        ulIvBits: (iv.len() * 8) as CK_ULONG,
        pAAD: aad.as_ptr() as *mut u8,
        ulAADLen: aad.len() as CK_ULONG,
        ulTagBits: TAG_BITS as CK_ULONG,
    }
}

/// Encrypts `plaintext` under `kek`, bound to `aad`, in one session.
pub(super) fn encrypt(
    s: &Session,
    kek: ObjectHandle,
    profile: &ModuleProfile,
    aad: &[u8],
    plaintext: &[u8],
) -> Result<Result<GcmOutput, GcmFault>, CkError> {
    let mut iv = vec![0u8; profile.iv_len];
    if profile.iv_source == IvSource::MessageApi {
        let mut tag = [0u8; TAG_LEN];
        let params = GcmMessageParams::new(&mut iv, 0.into(), GeneratorFunction::GenerateRandom, &mut tag)?;
        s.message_encrypt_init(&Mechanism::AesGcmMessage(params), kek)?;
        let encrypted = s.encrypt_message(&MessageParam::AesGcmMessage(params), aad, plaintext);
        let finished = s.message_encrypt_final();
        let mut ciphertext = encrypted?;
        finished?;
        ciphertext.extend_from_slice(&tag);
        return Ok(Ok(GcmOutput { iv, ciphertext }));
    }
    if profile.iv_source == IvSource::Caller {
        s.generate_random_slice(&mut iv)?;
    }
    let announced = match profile.iv_source {
        IvSource::Appended | IvSource::Prepended => 0,
        _ => iv.len(),
    };
    let params = gcm_params(&mut iv, announced, aad);
    let mechanism = Mechanism::VendorDefined(VendorDefinedMechanism::new(profile.gcm_mechanism, Some(&params)));
    let mut output = s.encrypt(&mechanism, kek, plaintext)?;
    let iv_len = profile.iv_len;
    Ok(match profile.iv_source {
        // A module that ignores a zeroed buffer and writes nothing would seal under IV 0 forever.
        IvSource::WrittenBack if iv.iter().all(|b| *b == 0) => Err(GcmFault::NoIvWrittenBack),
        IvSource::Appended | IvSource::Prepended if output.len() < iv_len + TAG_LEN => Err(GcmFault::ShortOutput),
        IvSource::Appended => {
            let iv = output.split_off(output.len() - iv_len);
            Ok(GcmOutput { iv, ciphertext: output })
        }
        IvSource::Prepended => {
            let ciphertext = output.split_off(iv_len);
            Ok(GcmOutput { iv: output, ciphertext })
        }
        // Caller IVs, and IVs written back (the message API returned above).
        _ => Ok(GcmOutput { iv, ciphertext: output }),
    })
}

/// Decrypts ciphertext ‖ tag under `kek` with the recorded `iv`, bound to `aad`: single-part
/// `C_Decrypt` with the IV passed in, whatever produced it.
pub(super) fn decrypt(
    s: &Session,
    kek: ObjectHandle,
    profile: &ModuleProfile,
    iv: &[u8],
    aad: &[u8],
    ciphertext: &[u8],
) -> Result<Vec<u8>, CkError> {
    let mut iv = iv.to_vec();
    let len = iv.len();
    let params = gcm_params(&mut iv, len, aad);
    let mechanism = Mechanism::VendorDefined(VendorDefinedMechanism::new(profile.gcm_mechanism, Some(&params)));
    s.decrypt(&mechanism, kek, ciphertext)
}
