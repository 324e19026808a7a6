//! What an activity does to authority state ([`Effect`]), and applying it: the one place the
//! state changes, run by the enclave on its state and checkable by the gateway on its records.

use serde::{Deserialize, Serialize};

use crate::model::{
    kinds, Account, ContractInterface, Credential, CredentialKind, Named, OrgState, Organization, Policy, PrivateKey,
    Tag, User, Wallet,
};

/// One change to one organization's authority state. Deletes name what must exist: applying a
/// delete of something missing is an error ([`ApplyError`]), as the gateway's writes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    /// A new organization (a sub-organization, or the operator's bootstrap): its whole first
    /// state is the effects that follow it in the same change list.
    CreateOrganization {
        organization: Organization,
    },
    /// A sub-organization deleted: its state goes (the enclave keeps no tombstone but its id).
    DeleteOrganization,
    /// Creates a user or replaces it (name, email, tags).
    PutUser {
        user: User,
    },
    /// Deletes users with every credential they hold.
    DeleteUsers {
        ids: Vec<String>,
    },
    AddCredential {
        credential: Credential,
    },
    /// Deletes credentials of one user, of one kind. A session key is an API key (with an
    /// expiry): removing API keys removes session keys too, as `delete_api_keys` does.
    RemoveCredentials {
        user_id: String,
        kind: CredentialKind,
        ids: Vec<String>,
    },
    SetRootQuorum {
        threshold: i64,
        user_ids: Vec<String>,
    },
    /// Creates or replaces a policy.
    PutPolicy {
        policy: Policy,
    },
    DeletePolicies {
        ids: Vec<String>,
    },
    /// Changes a user's name, email, phone number or tags (`None` leaves a field as it is).
    UpdateUser {
        id: String,
        name: Option<String>,
        email: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phone_number: Option<String>,
        tag_ids: Option<Vec<String>>,
    },
    /// Creates a tag (its members are added with [`Effect::UpdateTag`]).
    PutTag {
        kind: TagKind,
        tag: Tag,
    },
    /// Adds and removes members of a tag (users or private keys), then renames it.
    UpdateTag {
        kind: TagKind,
        id: String,
        new_name: Option<String>,
        add: Vec<String>,
        remove: Vec<String>,
    },
    /// Deletes tags and every membership of them.
    DeleteTags {
        kind: TagKind,
        ids: Vec<String>,
    },
    /// A new wallet: its id must be no wallet's, account's or private key's yet
    /// ([`ApplyError::Exists`]); a wallet is never replaced (see [`Effect::MarkWalletExported`]).
    PutWallet {
        wallet: Wallet,
    },
    /// New accounts of existing wallets, each with an id no key record has (nor an account
    /// before it in the list).
    PutAccounts {
        accounts: Vec<Account>,
    },
    DeleteWallets {
        ids: Vec<String>,
    },
    /// Every contact of a user is verified (a verification token verified the one just set, and
    /// the other is verified or absent).
    MarkContactsVerified {
        id: String,
    },
    /// A wallet's new name (`update_wallet`).
    RenameWallet {
        id: String,
        label: String,
    },
    /// Accounts removed from their wallets (`delete_wallet_accounts`); their ids are retired.
    DeleteAccounts {
        ids: Vec<String>,
    },
    /// A new private key, with an id no key record has; never a replacement.
    PutPrivateKey {
        private_key: PrivateKey,
    },
    DeletePrivateKeys {
        ids: Vec<String>,
    },
    /// A wallet's seed left the enclave (`export_wallet`).
    MarkWalletExported {
        id: String,
    },
    /// A wallet account's key left the enclave (`export_wallet_account`).
    MarkAccountExported {
        id: String,
    },
    /// A private key left the enclave (`export_private_key`).
    MarkPrivateKeyExported {
        id: String,
    },
    PutContractInterface {
        interface: ContractInterface,
    },
    DeleteContractInterfaces {
        ids: Vec<String>,
    },
    SetFeature {
        name: String,
        value: String,
    },
    /// Renames the organization.
    SetOrganizationName {
        name: String,
    },
    /// The organization's IP allowlist (`key` [`crate::model::ORGANIZATION_ALLOWLIST`]) or an API
    /// key's (its public key), set whole.
    PutIpAllowlist {
        key: String,
        allowlist: crate::model::IpAllowlist,
    },
    RemoveIpAllowlist {
        key: String,
    },
    /// A new invitation, with an id no invitation has.
    PutInvitation {
        id: String,
        invitation: crate::model::Invitation,
    },
    /// An open invitation, accepted or revoked: it goes.
    RemoveInvitation {
        id: String,
    },
    /// A new session profile, with an id no profile has.
    PutSessionProfile {
        id: String,
        profile: crate::model::SessionProfile,
    },
    RemoveFeature {
        name: String,
    },
    SetAuthProxy {
        enabled: bool,
    },
    /// `appName` of `update_auth_proxy_config` (empty: none): what the proxy's codes carry.
    SetAuthProxyAppName {
        app_name: String,
    },
    PutWebhookEndpoint {
        endpoint: Named,
    },
    DeleteWebhookEndpoints {
        ids: Vec<String>,
    },
    PutOauth2Credential {
        credential: Named,
    },
    DeleteOauth2Credentials {
        ids: Vec<String>,
    },
}

/// Which tags: user tags (members are users) or private-key tags (members are private keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TagKind {
    User,
    PrivateKey,
}

/// An effect for one organization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub organization_id: String,
    #[serde(flatten)]
    pub effect: Effect,
}

/// Why an effect cannot apply to a state: what it names is missing or already there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("{kind} {id} does not exist")]
    Missing { kind: &'static str, id: String },
    #[error("{kind} {id} already exists")]
    Exists { kind: &'static str, id: String },
    #[error("user {0} is in the root quorum")]
    RootUser(String),
    #[error("credential {id} does not belong to user {user_id}")]
    NotOwned { id: String, user_id: String },
}

/// Whether removing credentials of `kind` removes one of `other`: each kind its own, and API
/// keys session keys too (a session key is an API key with an expiry).
fn removes(kind: CredentialKind, other: CredentialKind) -> bool {
    kind == other || (kind == CredentialKind::ApiKey && other == CredentialKind::Session)
}

/// The entries an effect touched: `(kind, id)`, to write or delete in the store.
pub type Touched = Vec<(&'static str, String)>;

fn remove_all<T: Clone>(
    map: &mut imbl::OrdMap<String, T>,
    kind: &'static str,
    ids: &[String],
    touched: &mut Touched,
) -> Result<(), ApplyError> {
    if let Some(id) = ids.iter().find(|id| !map.contains_key(*id)) {
        return Err(ApplyError::Missing { kind, id: id.clone() });
    }
    for id in ids {
        map.remove(id);
        touched.push((kind, id.clone()));
    }
    Ok(())
}

impl OrgState {
    fn tags_mut(&mut self, kind: TagKind) -> (&mut imbl::OrdMap<String, Tag>, &'static str) {
        match kind {
            TagKind::User => (&mut self.user_tags, kinds::USER_TAG),
            TagKind::PrivateKey => (&mut self.private_key_tags, kinds::PRIVATE_KEY_TAG),
        }
    }

    /// The kind of the wallet, account or private key `id` names, if any, or
    /// [`kinds::RETIRED_KEY_ID`] when it named one that was deleted: the three share one
    /// namespace of key ids, and an id names one key only, ever.
    pub fn key_id_kind(&self, id: &str) -> Option<&'static str> {
        if self.wallets.contains_key(id) {
            Some(kinds::WALLET)
        } else if self.accounts.contains_key(id) {
            Some(kinds::ACCOUNT)
        } else if self.private_keys.contains_key(id) {
            Some(kinds::PRIVATE_KEY)
        } else if self.retired_key_ids.contains_key(id) {
            Some(kinds::RETIRED_KEY_ID)
        } else {
            None
        }
    }

    /// Keeps the ids of deleted keys (`kind` each), so that no new key gets one of them.
    fn retire(&mut self, kind: &'static str, ids: impl IntoIterator<Item = String>, touched: &mut Touched) {
        for id in ids {
            self.retired_key_ids.insert(id.clone(), kind.to_string());
            touched.push((kinds::RETIRED_KEY_ID, id));
        }
    }

    /// A new wallet, account or private key must have an id no key record has: the effects that
    /// create them never replace one (what a key is, and `exported`, change by their own effects).
    fn ensure_new_key_id(&self, id: &str) -> Result<(), ApplyError> {
        match self.key_id_kind(id) {
            Some(kind) => Err(ApplyError::Exists { kind, id: id.to_string() }),
            None => Ok(()),
        }
    }

    /// Applies one effect, all or nothing: on error the state is unchanged.
    pub fn apply(&mut self, effect: &Effect) -> Result<Touched, ApplyError> {
        let mut next = self.clone();
        let touched = next.apply_in_place(effect)?;
        *self = next;
        Ok(touched)
    }

    /// Applies effects in order, all or nothing.
    pub fn apply_all<'a>(&mut self, effects: impl IntoIterator<Item = &'a Effect>) -> Result<Touched, ApplyError> {
        let mut next = self.clone();
        let mut touched = Vec::new();
        for e in effects {
            touched.extend(next.apply_in_place(e)?);
        }
        *self = next;
        Ok(touched)
    }

    /// Applies effects in order to a state the caller discards on error (no copy is made: on
    /// error the state is partly changed).
    pub fn apply_all_unchecked<'a>(
        &mut self,
        effects: impl IntoIterator<Item = &'a Effect>,
    ) -> Result<Touched, ApplyError> {
        let mut touched = Vec::new();
        for e in effects {
            touched.extend(self.apply_in_place(e)?);
        }
        Ok(touched)
    }

    fn apply_in_place(&mut self, effect: &Effect) -> Result<Touched, ApplyError> {
        use kinds::*;
        let mut t: Touched = Vec::new();
        let org = (ORGANIZATION, ORGANIZATION.to_string());
        match effect {
            Effect::CreateOrganization { organization } => {
                self.organization = organization.clone();
                t.push(org);
            }
            Effect::DeleteOrganization => {
                let id = self.organization.id.clone();
                *self = OrgState::new(Organization { id, ..Default::default() });
            }
            Effect::PutUser { user } => {
                if let Some(tag) = user.tag_ids.iter().find(|t| !self.user_tags.contains_key(*t)) {
                    return Err(ApplyError::Missing { kind: USER_TAG, id: tag.clone() });
                }
                self.users.insert(user.id.clone(), user.clone());
                t.push((USER, user.id.clone()));
            }
            Effect::DeleteUsers { ids } => {
                if let Some(root) = ids.iter().find(|id| self.organization.root_user_ids.contains(id)) {
                    return Err(ApplyError::RootUser(root.clone()));
                }
                remove_all(&mut self.users, USER, ids, &mut t)?;
                let gone: Vec<Credential> =
                    self.credentials.values().filter(|c| ids.contains(&c.user_id)).cloned().collect();
                for c in gone {
                    self.unindex_credential(&c);
                    self.credentials.remove(&c.id);
                    t.push((CREDENTIAL, c.id));
                }
            }
            Effect::AddCredential { credential } => {
                if !self.users.contains_key(&credential.user_id) {
                    return Err(ApplyError::Missing { kind: USER, id: credential.user_id.clone() });
                }
                if self.credentials.contains_key(&credential.id) {
                    return Err(ApplyError::Exists { kind: CREDENTIAL, id: credential.id.clone() });
                }
                self.index_credential(credential);
                self.credentials.insert(credential.id.clone(), credential.clone());
                t.push((CREDENTIAL, credential.id.clone()));
            }
            Effect::RemoveCredentials { user_id, kind, ids } => {
                for id in ids {
                    match self.credentials.get(id) {
                        None => return Err(ApplyError::Missing { kind: CREDENTIAL, id: id.clone() }),
                        Some(c) if &c.user_id != user_id || !removes(*kind, c.kind) => {
                            return Err(ApplyError::NotOwned { id: id.clone(), user_id: user_id.clone() })
                        }
                        Some(_) => {}
                    }
                }
                for id in ids {
                    if let Some(c) = self.credentials.remove(id) {
                        self.unindex_credential(&c);
                    }
                    t.push((CREDENTIAL, id.clone()));
                }
            }
            Effect::SetRootQuorum { threshold, user_ids } => {
                if let Some(u) = user_ids.iter().find(|u| !self.users.contains_key(*u)) {
                    return Err(ApplyError::Missing { kind: USER, id: u.clone() });
                }
                self.organization.root_quorum_threshold = *threshold;
                self.organization.root_user_ids = user_ids.clone();
                t.push(org);
            }
            Effect::PutPolicy { policy } => {
                self.policies.insert(policy.id.clone(), policy.clone());
                t.push((POLICY, policy.id.clone()));
            }
            Effect::DeletePolicies { ids } => remove_all(&mut self.policies, POLICY, ids, &mut t)?,
            Effect::UpdateUser { id, name, email, phone_number, tag_ids } => {
                if let Some(tag) = tag_ids.iter().flatten().find(|t| !self.user_tags.contains_key(*t)) {
                    return Err(ApplyError::Missing { kind: USER_TAG, id: tag.clone() });
                }
                let user = self.users.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: USER, id: id.clone() })?;
                if let Some(n) = name {
                    user.name = n.clone();
                }
                // A contact set after the sign-up is the user's word, not a verified one.
                if let Some(e) = email.as_ref().filter(|e| **e != user.email) {
                    user.email = e.clone();
                    user.contacts_verified = false;
                }
                if let Some(p) = phone_number.as_ref().filter(|p| **p != user.phone_number) {
                    user.phone_number = p.clone();
                    user.contacts_verified = false;
                }
                if let Some(t) = tag_ids {
                    user.tag_ids = t.clone();
                }
                t.push((USER, id.clone()));
            }
            Effect::PutTag { kind, tag } => {
                let (map, k) = self.tags_mut(*kind);
                map.insert(tag.id.clone(), tag.clone());
                t.push((k, tag.id.clone()));
            }
            Effect::UpdateTag { kind, id, new_name, add, remove } => {
                let (map, k) = self.tags_mut(*kind);
                let tag = map.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: k, id: id.clone() })?;
                if let Some(n) = new_name {
                    tag.name = n.clone();
                }
                t.push((k, id.clone()));
                for member in add.iter().chain(remove) {
                    let adding = add.contains(member) && !remove.contains(member);
                    let edit = |tags: &mut Vec<String>| {
                        tags.retain(|x| x != id);
                        if adding {
                            tags.push(id.clone());
                        }
                    };
                    match kind {
                        TagKind::User => {
                            let u = self
                                .users
                                .get_mut(member)
                                .ok_or_else(|| ApplyError::Missing { kind: USER, id: member.clone() })?;
                            edit(&mut u.tag_ids);
                            t.push((USER, member.clone()));
                        }
                        TagKind::PrivateKey => {
                            let pk = self
                                .private_keys
                                .get_mut(member)
                                .ok_or_else(|| ApplyError::Missing { kind: PRIVATE_KEY, id: member.clone() })?;
                            edit(&mut pk.tags);
                            t.push((PRIVATE_KEY, member.clone()));
                        }
                    }
                }
            }
            Effect::DeleteTags { kind, ids } => {
                let (map, k) = self.tags_mut(*kind);
                remove_all(map, k, ids, &mut t)?;
                match kind {
                    TagKind::User => {
                        let tagged: Vec<String> = (self.users.iter())
                            .filter(|(_, u)| u.tag_ids.iter().any(|id| ids.contains(id)))
                            .map(|(key, _)| key.clone())
                            .collect();
                        for key in tagged {
                            if let Some(u) = self.users.get_mut(&key) {
                                u.tag_ids.retain(|id| !ids.contains(id));
                                t.push((USER, u.id.clone()));
                            }
                        }
                    }
                    TagKind::PrivateKey => {
                        let tagged: Vec<String> = (self.private_keys.iter())
                            .filter(|(_, pk)| pk.tags.iter().any(|id| ids.contains(id)))
                            .map(|(key, _)| key.clone())
                            .collect();
                        for key in tagged {
                            if let Some(pk) = self.private_keys.get_mut(&key) {
                                pk.tags.retain(|id| !ids.contains(id));
                                t.push((PRIVATE_KEY, pk.id.clone()));
                            }
                        }
                    }
                }
            }
            Effect::PutWallet { wallet } => {
                self.ensure_new_key_id(&wallet.id)?;
                self.wallets.insert(wallet.id.clone(), wallet.clone());
                t.push((WALLET, wallet.id.clone()));
            }
            Effect::PutAccounts { accounts } => {
                for a in accounts {
                    if !self.wallets.contains_key(&a.wallet_id) {
                        return Err(ApplyError::Missing { kind: WALLET, id: a.wallet_id.clone() });
                    }
                    // Checked against the accounts inserted just before too: an id twice in the
                    // list is refused.
                    self.ensure_new_key_id(&a.id)?;
                    self.index_account(a);
                    self.accounts.insert(a.id.clone(), a.clone());
                    t.push((ACCOUNT, a.id.clone()));
                }
            }
            Effect::DeleteWallets { ids } => {
                remove_all(&mut self.wallets, WALLET, ids, &mut t)?;
                self.retire(WALLET, ids.iter().cloned(), &mut t);
                let gone: Vec<Account> =
                    self.accounts.values().filter(|a| ids.contains(&a.wallet_id)).cloned().collect();
                for a in gone {
                    self.unindex_account(&a);
                    self.accounts.remove(&a.id);
                    t.push((ACCOUNT, a.id.clone()));
                    self.retire(ACCOUNT, [a.id], &mut t);
                }
            }
            Effect::MarkContactsVerified { id } => {
                let user = self.users.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: USER, id: id.clone() })?;
                user.contacts_verified = true;
                t.push((USER, id.clone()));
            }
            Effect::RenameWallet { id, label } => {
                let w = self.wallets.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: WALLET, id: id.clone() })?;
                w.label = label.clone();
                t.push((WALLET, id.clone()));
            }
            Effect::DeleteAccounts { ids } => {
                let gone: Vec<Account> = ids.iter().filter_map(|id| self.accounts.get(id).cloned()).collect();
                remove_all(&mut self.accounts, ACCOUNT, ids, &mut t)?;
                for a in &gone {
                    self.unindex_account(a);
                }
                self.retire(ACCOUNT, ids.iter().cloned(), &mut t);
            }
            Effect::PutPrivateKey { private_key } => {
                self.ensure_new_key_id(&private_key.id)?;
                self.private_keys.insert(private_key.id.clone(), private_key.clone());
                t.push((PRIVATE_KEY, private_key.id.clone()));
            }
            Effect::DeletePrivateKeys { ids } => {
                remove_all(&mut self.private_keys, PRIVATE_KEY, ids, &mut t)?;
                self.retire(PRIVATE_KEY, ids.iter().cloned(), &mut t);
            }
            Effect::MarkWalletExported { id } => {
                let w = self.wallets.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: WALLET, id: id.clone() })?;
                w.exported = true;
                t.push((WALLET, id.clone()));
            }
            Effect::MarkAccountExported { id } => {
                let a =
                    self.accounts.get_mut(id).ok_or_else(|| ApplyError::Missing { kind: ACCOUNT, id: id.clone() })?;
                a.exported = true;
                t.push((ACCOUNT, id.clone()));
            }
            Effect::MarkPrivateKeyExported { id } => {
                let k = self
                    .private_keys
                    .get_mut(id)
                    .ok_or_else(|| ApplyError::Missing { kind: PRIVATE_KEY, id: id.clone() })?;
                k.exported = true;
                t.push((PRIVATE_KEY, id.clone()));
            }
            Effect::PutContractInterface { interface } => {
                self.contract_interfaces.insert(interface.id.clone(), interface.clone());
                t.push((CONTRACT_INTERFACE, interface.id.clone()));
            }
            Effect::DeleteContractInterfaces { ids } => {
                remove_all(&mut self.contract_interfaces, CONTRACT_INTERFACE, ids, &mut t)?
            }
            Effect::SetFeature { name, value } => {
                self.organization.features.insert(name.clone(), value.clone());
                t.push(org);
            }
            Effect::SetOrganizationName { name } => {
                self.organization.name = name.clone();
                t.push(org);
            }
            Effect::PutIpAllowlist { key, allowlist } => {
                self.organization.ip_allowlists.insert(key.clone(), allowlist.clone());
                t.push(org);
            }
            Effect::PutInvitation { id, invitation } => {
                if self.organization.invitations.contains_key(id) {
                    return Err(ApplyError::Exists { kind: ORGANIZATION, id: format!("invitation {id}") });
                }
                self.organization.invitations.insert(id.clone(), invitation.clone());
                t.push(org);
            }
            Effect::RemoveInvitation { id } => {
                if self.organization.invitations.remove(id).is_none() {
                    return Err(ApplyError::Missing { kind: ORGANIZATION, id: format!("invitation {id}") });
                }
                t.push(org);
            }
            Effect::PutSessionProfile { id, profile } => {
                if self.organization.session_profiles.contains_key(id) {
                    return Err(ApplyError::Exists { kind: ORGANIZATION, id: format!("session profile {id}") });
                }
                self.organization.session_profiles.insert(id.clone(), profile.clone());
                t.push(org);
            }
            Effect::RemoveIpAllowlist { key } => {
                if self.organization.ip_allowlists.remove(key).is_none() {
                    return Err(ApplyError::Missing { kind: ORGANIZATION, id: format!("IP allowlist {key:?}") });
                }
                t.push(org);
            }
            Effect::RemoveFeature { name } => {
                self.organization.features.remove(name);
                t.push(org);
            }
            Effect::SetAuthProxy { enabled } => {
                self.organization.auth_proxy_enabled = *enabled;
                t.push(org);
            }
            Effect::SetAuthProxyAppName { app_name } => {
                self.organization.auth_proxy_app_name = app_name.clone();
                t.push(org);
            }
            Effect::PutWebhookEndpoint { endpoint } => {
                self.webhook_endpoints.insert(endpoint.id.clone(), endpoint.clone());
                t.push((WEBHOOK_ENDPOINT, endpoint.id.clone()));
            }
            Effect::DeleteWebhookEndpoints { ids } => {
                remove_all(&mut self.webhook_endpoints, WEBHOOK_ENDPOINT, ids, &mut t)?
            }
            Effect::PutOauth2Credential { credential } => {
                self.oauth2_credentials.insert(credential.id.clone(), credential.clone());
                t.push((OAUTH2_CREDENTIAL, credential.id.clone()));
            }
            Effect::DeleteOauth2Credentials { ids } => {
                remove_all(&mut self.oauth2_credentials, OAUTH2_CREDENTIAL, ids, &mut t)?
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AddressEntry;

    fn state() -> OrgState {
        let mut s = OrgState::new(Organization {
            id: "o".into(),
            name: "o".into(),
            root_quorum_threshold: 1,
            root_user_ids: vec!["root".into()],
            ..Default::default()
        });
        s.apply(&Effect::PutUser { user: User { id: "root".into(), name: "root".into(), ..Default::default() } })
            .unwrap();
        s
    }

    fn key(id: &str, user: &str, pk: &str) -> Effect {
        Effect::AddCredential {
            credential: Credential {
                id: id.into(),
                user_id: user.into(),
                kind: CredentialKind::ApiKey,
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                public_key: pk.into(),
                expires_at_ms: 0,
            },
        }
    }

    #[test]
    fn deleting_a_user_revokes_every_credential_it_holds_and_round_trips_through_entries() {
        let mut s = state();
        s.apply(&Effect::PutUser { user: User { id: "u".into(), name: "u".into(), ..Default::default() } }).unwrap();
        s.apply(&key("k1", "u", "02aa")).unwrap();
        s.apply(&key("k2", "root", "02bb")).unwrap();
        assert!(s.live_credential("u", "02aa", "CREDENTIAL_TYPE_API_KEY_P256", 0).is_some());
        let back = OrgState::from_entries(
            3,
            s.entries().iter().map(|e| (e.kind, e.id.as_str(), e.data.as_slice())).collect::<Vec<_>>(),
        )
        .unwrap();
        let mut expected = s.clone();
        expected.version = 3;
        assert_eq!(expected, back);
        let touched = s.apply(&Effect::DeleteUsers { ids: vec!["u".into()] }).unwrap();
        assert_eq!(touched, vec![(kinds::USER, "u".to_string()), (kinds::CREDENTIAL, "k1".to_string())]);
        assert!(s.live_credential("u", "02aa", "CREDENTIAL_TYPE_API_KEY_P256", 0).is_none());
        assert!(s.credentials_by_public_key("02aa").next().is_none());
        assert!(s.live_credential("root", "02bb", "CREDENTIAL_TYPE_API_KEY_P256", 0).is_some());
    }

    #[test]
    fn a_contact_set_after_the_sign_up_is_no_longer_verified() {
        let mut s = state();
        let user = User {
            id: "u".into(),
            name: "u".into(),
            email: "a@x.test".into(),
            phone_number: "+15550001".into(),
            contacts_verified: true,
            ..Default::default()
        };
        s.apply(&Effect::PutUser { user }).unwrap();
        let update = |email: Option<&str>, phone: Option<&str>, name: Option<&str>| Effect::UpdateUser {
            id: "u".into(),
            name: name.map(str::to_string),
            email: email.map(str::to_string),
            phone_number: phone.map(str::to_string),
            tag_ids: None,
        };
        // A new name, or the same contacts again: still verified.
        s.apply(&update(Some("a@x.test"), Some("+15550001"), Some("v"))).unwrap();
        assert!(s.users["u"].contacts_verified);
        s.apply(&update(None, Some("+15550002"), None)).unwrap();
        assert!(!s.users["u"].contacts_verified);
        // Not verified again by setting the old address back.
        s.apply(&update(Some("a@x.test"), Some("+15550001"), None)).unwrap();
        assert!(!s.users["u"].contacts_verified);
        // Left out of the serialized form when false, so older states read and write the same.
        assert!(!serde_json::to_string(&s.users["u"]).unwrap().contains("contacts_verified"));
    }

    #[test]
    fn a_failing_effect_changes_nothing() {
        let mut s = state();
        let before = s.clone();
        assert_eq!(
            s.apply(&Effect::DeleteUsers { ids: vec!["root".into()] }),
            Err(ApplyError::RootUser("root".into()))
        );
        assert_eq!(
            s.apply_all(&[key("k", "root", "02"), Effect::DeletePolicies { ids: vec!["nope".into()] }]),
            Err(ApplyError::Missing { kind: kinds::POLICY, id: "nope".into() })
        );
        assert_eq!(s, before);
        assert!(s.credentials_by_public_key("02").next().is_none());
    }

    #[test]
    fn credentials_expire_and_removal_checks_the_owner() {
        let mut s = state();
        let mut c = Credential {
            id: "s".into(),
            user_id: "root".into(),
            kind: CredentialKind::Session,
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            public_key: "02cc".into(),
            expires_at_ms: 1_000,
        };
        s.apply(&Effect::AddCredential { credential: c.clone() }).unwrap();
        assert!(s.live_credential("root", "02cc", &c.credential_type, 999).is_some());
        assert!(s.live_credential("root", "02cc", &c.credential_type, 1_000).is_none());
        c.user_id = "other".into();
        assert!(matches!(
            s.apply(&Effect::RemoveCredentials {
                user_id: "other".into(),
                kind: CredentialKind::Session,
                ids: vec!["s".into()]
            }),
            Err(ApplyError::NotOwned { .. })
        ));
    }

    fn account(id: &str, wallet_id: &str, address: &str) -> Account {
        Account {
            id: id.into(),
            wallet_id: wallet_id.into(),
            address: address.into(),
            address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
            exported: false,
        }
    }

    fn cold_key(id: &str, label: &str, address: &str) -> Effect {
        Effect::PutPrivateKey {
            private_key: PrivateKey {
                id: id.into(),
                label: label.into(),
                tags: vec!["cold".into()],
                addresses: vec![AddressEntry { format: "ADDRESS_FORMAT_ETHEREUM".into(), address: address.into() }],
                ..Default::default()
            },
        }
    }

    #[test]
    fn an_existing_private_key_is_never_replaced() {
        let mut s = state();
        s.apply(&cold_key("cold", "cold", "0xc01d")).unwrap();
        let before = s.clone();
        assert_eq!(
            s.apply(&cold_key("cold", "warm", "0x3a3a")),
            Err(ApplyError::Exists { kind: kinds::PRIVATE_KEY, id: "cold".into() })
        );
        assert_eq!(s, before);
        assert_eq!(s.private_keys["cold"].addresses[0].address, "0xc01d");
        // Twice in one change list: the second is refused and the list changes nothing.
        assert_eq!(
            s.apply_all(&[cold_key("k", "k", "0x01"), cold_key("k", "k2", "0x02")]),
            Err(ApplyError::Exists { kind: kinds::PRIVATE_KEY, id: "k".into() })
        );
        assert_eq!(s, before);
    }

    #[test]
    fn an_existing_wallet_or_account_is_never_replaced_and_keeps_exported() {
        let mut s = state();
        let wallet = |id: &str, label: &str| Effect::PutWallet {
            wallet: Wallet { id: id.into(), label: label.into(), imported: false, exported: false },
        };
        s.apply_all(&[wallet("w", "w"), Effect::PutAccounts { accounts: vec![account("a", "w", "0xaa")] }]).unwrap();
        s.apply(&Effect::MarkWalletExported { id: "w".into() }).unwrap();
        let before = s.clone();
        // The same wallet id again would reset `exported`: refused.
        assert_eq!(s.apply(&wallet("w", "fresh")), Err(ApplyError::Exists { kind: kinds::WALLET, id: "w".into() }));
        assert!(s.wallets["w"].exported);
        // An existing account id, in another wallet or its own; or one id twice in one list.
        let again = [wallet("w2", "w2"), Effect::PutAccounts { accounts: vec![account("a", "w2", "0xbb")] }];
        assert_eq!(s.apply_all(&again), Err(ApplyError::Exists { kind: kinds::ACCOUNT, id: "a".into() }));
        let twice = Effect::PutAccounts { accounts: vec![account("b", "w", "0xbb"), account("b", "w", "0xcc")] };
        assert_eq!(s.apply(&twice), Err(ApplyError::Exists { kind: kinds::ACCOUNT, id: "b".into() }));
        // Wallets, accounts and private keys share one namespace of ids.
        assert_eq!(
            s.apply(&cold_key("a", "k", "0x01")),
            Err(ApplyError::Exists { kind: kinds::ACCOUNT, id: "a".into() })
        );
        assert_eq!(s.apply(&wallet("a", "x")), Err(ApplyError::Exists { kind: kinds::ACCOUNT, id: "a".into() }));
        let named_as_wallet = Effect::PutAccounts { accounts: vec![account("w", "w", "0xdd")] };
        assert_eq!(s.apply(&named_as_wallet), Err(ApplyError::Exists { kind: kinds::WALLET, id: "w".into() }));
        assert_eq!(s, before);
        assert_eq!(s.account_by_address("0xaa").map(|a| a.wallet_id.as_str()), Some("w"));
        // New ids still apply.
        s.apply(&Effect::PutAccounts { accounts: vec![account("b", "w", "0xbb")] }).unwrap();
        assert_eq!(s.accounts["b"].wallet_id, "w");
        // A deleted wallet's ids, and a deleted key's, are never given again; they read back.
        s.apply(&cold_key("k", "k", "0x01")).unwrap();
        s.apply(&Effect::DeleteWallets { ids: vec!["w".into()] }).unwrap();
        s.apply(&Effect::DeletePrivateKeys { ids: vec!["k".into()] }).unwrap();
        let retired = |id: &str| Err(ApplyError::Exists { kind: kinds::RETIRED_KEY_ID, id: id.into() });
        assert_eq!(s.apply(&wallet("w", "again")), retired("w"));
        s.apply(&wallet("w3", "w3")).unwrap();
        let reused = Effect::PutAccounts { accounts: vec![account("b", "w3", "0xbb")] };
        assert_eq!(s.apply(&reused), retired("b"));
        assert_eq!(s.apply(&cold_key("k", "k", "0x01")), retired("k"));
        assert_eq!(s.apply(&wallet("a", "x")), retired("a"));
        let back = OrgState::from_entries(
            s.version,
            s.entries().iter().map(|e| (e.kind, e.id.as_str(), e.data.as_slice())).collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(back, s);
        assert_eq!(back.key_id_kind("k"), Some(kinds::RETIRED_KEY_ID));
    }
}
