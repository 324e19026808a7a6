//! The authority state of one organization, and its storage as entries (kind, id, JSON bytes).

use std::collections::BTreeMap;

use imbl::{HashMap, OrdMap};

use serde::{Deserialize, Serialize};

/// Unix time in milliseconds.
pub type Millis = i64;

/// The organization itself: its place in the tree, its root quorum and the settings that change
/// how its members authenticate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Organization {
    pub id: String,
    pub name: String,
    pub parent_id: Option<String>,
    pub root_quorum_threshold: i64,
    pub root_user_ids: Vec<String>,
    /// `set_organization_feature`: name → value.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Whether the auth proxy's key may stamp for this organization.
    #[serde(default)]
    pub auth_proxy_enabled: bool,
    /// A sub-organization the auth proxy signed up (or whose parent marked it so when it created
    /// it: `authProxySignup` in the body, [`crate::transition::AUTH_PROXY_SIGNUP`]). What Coffer
    /// sends for it carries nothing of its own (no app name, sender, reply-to, logo, link or
    /// template) and counts against its parent's allowance. Set only when it is created; left out
    /// when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auth_proxy_signup: bool,
    /// The app name the auth proxy's one-time codes carry, in this organization and in the
    /// sub-organizations it signed up: `appName` of `update_auth_proxy_config`, as the enclave
    /// recorded it ([`crate::transition::auth_proxy_app_name`]); empty: none set. Left out when
    /// empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auth_proxy_app_name: String,
    /// `set_ip_allowlist`: the organization's list (key [`ORGANIZATION_ALLOWLIST`]) and each API
    /// key's (by public key). Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ip_allowlists: BTreeMap<String, IpAllowlist>,
    /// `create_session_profile`, by id: never changed nor deleted (as the hosted service's).
    /// Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub session_profiles: BTreeMap<String, SessionProfile>,
    /// `create_invitations`, by id: the open ones (an accepted or revoked invitation goes, so
    /// that what an organization keeps is bounded). Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub invitations: BTreeMap<String, Invitation>,
}

/// An invitation to join the organization: who receives it (the enclave mails them its
/// acceptance code) and the user its acceptance makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Invitation {
    pub receiver_user_name: String,
    pub receiver_email: String,
    /// User tag ids the accepted user carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receiver_user_tags: Vec<String>,
    /// `ACCESS_TYPE_WEB`, `ACCESS_TYPE_API` or `ACCESS_TYPE_ALL`.
    pub access_type: String,
    pub sender_user_id: String,
    /// `INVITATION_STATUS_CREATED`: an open invitation (the only ones kept).
    pub status: String,
}

/// A session profile: what the sessions that name it are (the enclave issues them so).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SessionProfile {
    /// The `session_type` of its sessions' JWTs.
    pub name: String,
    /// Policy language (a condition), carried in its sessions' JWTs as `scope`.
    pub scope: String,
    /// The longest its sessions live; `None`: as the login asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
}

/// The key of the organization-wide list in [`Organization::ip_allowlists`] (an API key's is its
/// public key, which is never empty).
pub const ORGANIZATION_ALLOWLIST: &str = "";

/// An IP allowlist: the client addresses requests may come from (enforced by the gateway, which
/// alone sees them; README "IP allowlists").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IpAllowlist {
    /// The organization's list is enforced only while enabled (and an API key's only while the
    /// organization's is); always true for an API key's.
    pub enabled: bool,
    /// `ALLOW` or `DENY`: what a request whose address cannot be evaluated gets.
    pub on_evaluation_error: String,
    pub rules: Vec<IpRule>,
}

/// One CIDR of an [`IpAllowlist`], as given (checked to parse), with its label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IpRule {
    pub cidr: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct User {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub email: String,
    /// E.164, as the user was created or updated with; empty: none. Left out of the serialized
    /// form when empty, so a state written before the field existed reads and writes the same.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phone_number: String,
    /// The user tags the user carries (ids).
    #[serde(default)]
    pub tag_ids: Vec<String>,
    /// The email and phone number are those the sub-organization's sign-up gave (its parent's
    /// word, or a verification token's), unchanged since. A login its parent submits for it (the
    /// auth proxy's, a backend's `otp_login`) finds only such a user by contact: a contact the
    /// sub-organization's own users set is theirs to claim, not a proof. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contacts_verified: bool,
}

/// What a credential is, for revocation: which activity removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    ApiKey,
    Passkey,
    OauthIdentity,
    /// A session key the enclave issued at a login (an API key with an expiry).
    Session,
}

/// A credential a user stamps with: an API key, a passkey, an OAuth identity or a session key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    /// The gateway's record id (API key id, authenticator id, OAuth provider id).
    pub id: String,
    pub user_id: String,
    pub kind: CredentialKind,
    /// `CREDENTIAL_TYPE_*` as certified.
    pub credential_type: String,
    /// The key a stamp is verified against (hex), or an OAuth identity's hash.
    pub public_key: String,
    /// 0: no expiry.
    #[serde(default)]
    pub expires_at_ms: u64,
}

impl Credential {
    /// Whether it still authenticates at `now`.
    pub fn live(&self, now: Millis) -> bool {
        self.expires_at_ms == 0 || now < self.expires_at_ms as i64
    }
}

/// A policy as created: the engine compiles it from these fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub id: String,
    pub name: String,
    pub effect: String,
    #[serde(default)]
    pub condition: String,
    #[serde(default)]
    pub consensus: String,
    #[serde(default)]
    pub time: String,
}

/// A user tag or a private-key tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Wallet {
    pub id: String,
    pub label: String,
    #[serde(default)]
    pub imported: bool,
    #[serde(default)]
    pub exported: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub id: String,
    pub wallet_id: String,
    pub address: String,
    pub address_format: String,
    #[serde(default)]
    pub exported: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressEntry {
    pub format: String,
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PrivateKey {
    pub id: String,
    pub label: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub imported: bool,
    #[serde(default)]
    pub exported: bool,
    #[serde(default)]
    pub addresses: Vec<AddressEntry>,
}

/// A smart contract interface (an Ethereum ABI or a Solana IDL) policies decode calls with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractInterface {
    pub id: String,
    pub address: String,
    /// `SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM` / `_SOLANA`.
    pub interface_type: String,
    pub body: String,
}

/// A record the enclave only needs to know exists and what it names (webhook endpoints, OAuth
/// 2.0 credentials): its id and a digest of what decides (URL, provider and client id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Named {
    pub id: String,
    pub value: String,
}

/// Everything the enclave's decisions read about one organization. Its maps are persistent
/// (`imbl`): a clone is cheap, and the next version shares every entry a change did not touch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OrgState {
    /// The store's version of this state (0: not stored yet).
    pub version: u64,
    pub organization: Organization,
    pub users: OrdMap<String, User>,
    /// By credential id.
    pub credentials: OrdMap<String, Credential>,
    pub policies: OrdMap<String, Policy>,
    pub user_tags: OrdMap<String, Tag>,
    pub private_key_tags: OrdMap<String, Tag>,
    pub wallets: OrdMap<String, Wallet>,
    /// By account id.
    pub accounts: OrdMap<String, Account>,
    pub private_keys: OrdMap<String, PrivateKey>,
    pub contract_interfaces: OrdMap<String, ContractInterface>,
    pub webhook_endpoints: OrdMap<String, Named>,
    pub oauth2_credentials: OrdMap<String, Named>,
    /// Ids of deleted wallets, accounts and private keys, with the kind each was: never given
    /// to a new key again (a blob the gateway kept from before would bind to it).
    pub retired_key_ids: OrdMap<String, String>,
    /// Credential ids by public key (derived; rebuilt on load).
    by_public_key: HashMap<String, Vec<String>>,
    /// Account ids by address (derived; rebuilt on load).
    by_address: HashMap<String, String>,
}

/// One stored entry of a state: `kind`, `id` and the JSON of the item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub id: String,
    pub data: Vec<u8>,
}

/// Entry kinds, one per map of [`OrgState`].
pub mod kinds {
    pub const ORGANIZATION: &str = "organization";
    pub const USER: &str = "user";
    pub const CREDENTIAL: &str = "credential";
    pub const POLICY: &str = "policy";
    pub const USER_TAG: &str = "user_tag";
    pub const PRIVATE_KEY_TAG: &str = "private_key_tag";
    pub const WALLET: &str = "wallet";
    pub const ACCOUNT: &str = "account";
    pub const PRIVATE_KEY: &str = "private_key";
    pub const CONTRACT_INTERFACE: &str = "contract_interface";
    pub const WEBHOOK_ENDPOINT: &str = "webhook_endpoint";
    pub const OAUTH2_CREDENTIAL: &str = "oauth2_credential";
    /// The id of a deleted wallet, account or private key (data: the kind it was).
    pub const RETIRED_KEY_ID: &str = "retired_key_id";
    pub const ALL: &[&str] = &[
        ORGANIZATION,
        USER,
        CREDENTIAL,
        POLICY,
        USER_TAG,
        PRIVATE_KEY_TAG,
        WALLET,
        ACCOUNT,
        PRIVATE_KEY,
        CONTRACT_INTERFACE,
        WEBHOOK_ENDPOINT,
        OAUTH2_CREDENTIAL,
        RETIRED_KEY_ID,
    ];
}

/// A stored entry that does not read back: the store was written by something else.
#[derive(Debug, thiserror::Error)]
#[error("authority state entry {kind}/{id} does not parse: {reason}")]
pub struct CorruptEntry {
    pub kind: String,
    pub id: String,
    pub reason: String,
}

fn encode<T: Serialize>(kind: &'static str, id: &str, item: &T) -> Entry {
    // Serializing these plain structs to JSON cannot fail (string keys, no custom impls).
    let data = serde_json::to_vec(item).unwrap_or_default();
    Entry { kind, id: id.to_string(), data }
}

impl OrgState {
    /// How many records it holds (users, credentials, policies, tags, wallets, accounts, keys,
    /// contract interfaces, webhook endpoints, OAuth 2.0 credentials, open invitations), the
    /// retired ids aside.
    pub fn record_count(&self) -> usize {
        self.organization.invitations.len()
            + self.users.len()
            + self.credentials.len()
            + self.policies.len()
            + self.user_tags.len()
            + self.private_key_tags.len()
            + self.wallets.len()
            + self.accounts.len()
            + self.private_keys.len()
            + self.contract_interfaces.len()
            + self.webhook_endpoints.len()
            + self.oauth2_credentials.len()
    }

    /// A new organization's state (version 0: not stored yet).
    pub fn new(organization: Organization) -> Self {
        Self { organization, ..Default::default() }
    }

    /// The credentials with this public key (or OAuth identity hash).
    pub fn credentials_by_public_key(&self, public_key: &str) -> impl Iterator<Item = &Credential> {
        self.by_public_key.get(public_key).into_iter().flatten().filter_map(|id| self.credentials.get(id))
    }

    /// The live credential of `user_id` with `public_key` and `credential_type`, if any.
    pub fn live_credential(
        &self,
        user_id: &str,
        public_key: &str,
        credential_type: &str,
        now: Millis,
    ) -> Option<&Credential> {
        if !self.users.contains_key(user_id) {
            return None;
        }
        self.credentials_by_public_key(public_key)
            .find(|c| c.user_id == user_id && c.credential_type == credential_type && c.live(now))
    }

    pub fn account_by_address(&self, address: &str) -> Option<&Account> {
        self.by_address.get(address).and_then(|id| self.accounts.get(id))
    }

    pub fn private_key_by_address(&self, address: &str) -> Option<&PrivateKey> {
        self.private_keys.values().find(|k| k.addresses.iter().any(|a| a.address == address))
    }

    pub(crate) fn index_credential(&mut self, c: &Credential) {
        let ids = self.by_public_key.entry(c.public_key.clone()).or_default();
        if !ids.contains(&c.id) {
            ids.push(c.id.clone());
        }
    }

    pub(crate) fn unindex_credential(&mut self, c: &Credential) {
        if let Some(ids) = self.by_public_key.get_mut(&c.public_key) {
            ids.retain(|i| i != &c.id);
            if ids.is_empty() {
                self.by_public_key.remove(&c.public_key);
            }
        }
    }

    pub(crate) fn index_account(&mut self, a: &Account) {
        self.by_address.insert(a.address.clone(), a.id.clone());
    }

    pub(crate) fn unindex_account(&mut self, a: &Account) {
        if self.by_address.get(&a.address) == Some(&a.id) {
            self.by_address.remove(&a.address);
        }
    }

    /// The stored entry of `(kind, id)` as it is now, or `None` when it no longer exists.
    pub fn entry(&self, kind: &str, id: &str) -> Option<Entry> {
        use kinds::*;
        match kind {
            ORGANIZATION => Some(encode(ORGANIZATION, ORGANIZATION, &self.organization)),
            USER => self.users.get(id).map(|v| encode(USER, id, v)),
            CREDENTIAL => self.credentials.get(id).map(|v| encode(CREDENTIAL, id, v)),
            POLICY => self.policies.get(id).map(|v| encode(POLICY, id, v)),
            USER_TAG => self.user_tags.get(id).map(|v| encode(USER_TAG, id, v)),
            PRIVATE_KEY_TAG => self.private_key_tags.get(id).map(|v| encode(PRIVATE_KEY_TAG, id, v)),
            WALLET => self.wallets.get(id).map(|v| encode(WALLET, id, v)),
            ACCOUNT => self.accounts.get(id).map(|v| encode(ACCOUNT, id, v)),
            PRIVATE_KEY => self.private_keys.get(id).map(|v| encode(PRIVATE_KEY, id, v)),
            CONTRACT_INTERFACE => self.contract_interfaces.get(id).map(|v| encode(CONTRACT_INTERFACE, id, v)),
            WEBHOOK_ENDPOINT => self.webhook_endpoints.get(id).map(|v| encode(WEBHOOK_ENDPOINT, id, v)),
            OAUTH2_CREDENTIAL => self.oauth2_credentials.get(id).map(|v| encode(OAUTH2_CREDENTIAL, id, v)),
            RETIRED_KEY_ID => self.retired_key_ids.get(id).map(|v| encode(RETIRED_KEY_ID, id, v)),
            _ => None,
        }
    }

    /// Every entry of the state (what an empty store receives).
    pub fn entries(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for kind in kinds::ALL {
            for id in self.ids(kind) {
                out.extend(self.entry(kind, &id));
            }
        }
        out
    }

    fn ids(&self, kind: &str) -> Vec<String> {
        use kinds::*;
        let keys = |m: &dyn Fn() -> Vec<String>| m();
        match kind {
            ORGANIZATION => vec![ORGANIZATION.to_string()],
            USER => keys(&|| self.users.keys().cloned().collect()),
            CREDENTIAL => keys(&|| self.credentials.keys().cloned().collect()),
            POLICY => keys(&|| self.policies.keys().cloned().collect()),
            USER_TAG => keys(&|| self.user_tags.keys().cloned().collect()),
            PRIVATE_KEY_TAG => keys(&|| self.private_key_tags.keys().cloned().collect()),
            WALLET => keys(&|| self.wallets.keys().cloned().collect()),
            ACCOUNT => keys(&|| self.accounts.keys().cloned().collect()),
            PRIVATE_KEY => keys(&|| self.private_keys.keys().cloned().collect()),
            CONTRACT_INTERFACE => keys(&|| self.contract_interfaces.keys().cloned().collect()),
            WEBHOOK_ENDPOINT => keys(&|| self.webhook_endpoints.keys().cloned().collect()),
            OAUTH2_CREDENTIAL => keys(&|| self.oauth2_credentials.keys().cloned().collect()),
            RETIRED_KEY_ID => keys(&|| self.retired_key_ids.keys().cloned().collect()),
            _ => Vec::new(),
        }
    }

    /// Reads a state back from its stored entries.
    pub fn from_entries<'a>(
        version: u64,
        entries: impl IntoIterator<Item = (&'a str, &'a str, &'a [u8])>,
    ) -> Result<Self, CorruptEntry> {
        use kinds::*;
        fn parse<T: for<'de> Deserialize<'de>>(kind: &str, id: &str, data: &[u8]) -> Result<T, CorruptEntry> {
            serde_json::from_slice(data).map_err(|e| CorruptEntry {
                kind: kind.to_string(),
                id: id.to_string(),
                reason: e.to_string(),
            })
        }
        let mut s = Self { version, ..Default::default() };
        for (kind, id, data) in entries {
            let key = id.to_string();
            match kind {
                ORGANIZATION => s.organization = parse(kind, id, data)?,
                USER => {
                    s.users.insert(key, parse(kind, id, data)?);
                }
                CREDENTIAL => {
                    let c: Credential = parse(kind, id, data)?;
                    s.index_credential(&c);
                    s.credentials.insert(key, c);
                }
                POLICY => {
                    s.policies.insert(key, parse(kind, id, data)?);
                }
                USER_TAG => {
                    s.user_tags.insert(key, parse(kind, id, data)?);
                }
                PRIVATE_KEY_TAG => {
                    s.private_key_tags.insert(key, parse(kind, id, data)?);
                }
                WALLET => {
                    s.wallets.insert(key, parse(kind, id, data)?);
                }
                ACCOUNT => {
                    let a: Account = parse(kind, id, data)?;
                    s.index_account(&a);
                    s.accounts.insert(key, a);
                }
                PRIVATE_KEY => {
                    s.private_keys.insert(key, parse(kind, id, data)?);
                }
                CONTRACT_INTERFACE => {
                    s.contract_interfaces.insert(key, parse(kind, id, data)?);
                }
                WEBHOOK_ENDPOINT => {
                    s.webhook_endpoints.insert(key, parse(kind, id, data)?);
                }
                OAUTH2_CREDENTIAL => {
                    s.oauth2_credentials.insert(key, parse(kind, id, data)?);
                }
                RETIRED_KEY_ID => {
                    s.retired_key_ids.insert(key, parse(kind, id, data)?);
                }
                other => return Err(CorruptEntry { kind: other.to_string(), id: key, reason: "unknown kind".into() }),
            }
        }
        Ok(s)
    }
}
