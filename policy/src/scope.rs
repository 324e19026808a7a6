//! Which activities a policy can apply to, read from its condition, so a large policy set is
//! indexed by activity type instead of evaluated whole for every activity.

use crate::expr::{CmpOp, Expr};

/// What a condition requires of `activity.type`, `activity.resource` and `activity.action`
/// through its top-level conjuncts (`activity.type == '…'`, `activity.resource in ['…', …]`,
/// with the literal on either side). `None`: no requirement found.
///
/// Sound by construction: a conjunct of the top-level `&&` that is false makes the condition
/// false (or an error, since `&&` evaluates every operand), and a policy whose condition is false
/// is `OUTCOME_DENY_IMPLICIT`, which no decision counts. An error would count for a DENY (denies
/// fail closed, [`crate::decision`]), so `evaluate_policy` reads a DENY whose condition errs but
/// whose scope excludes the activity as `OUTCOME_DENY_IMPLICIT` too: skipping the policy by its
/// scope and evaluating it decide the same.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scope {
    pub types: Option<Vec<String>>,
    pub resources: Option<Vec<String>>,
    pub actions: Option<Vec<String>>,
}

impl Scope {
    /// Reads the scope of a parsed condition.
    pub fn of(condition: &Expr) -> Scope {
        let mut scope = Scope::default();
        scope.read(condition);
        scope
    }

    fn read(&mut self, e: &Expr) {
        match e {
            Expr::And(items) => items.iter().for_each(|i| self.read(i)),
            Expr::Compare(CmpOp::Eq, a, b) => {
                let pair = match (activity_field(a), literal(b), activity_field(b), literal(a)) {
                    (Some(f), Some(v), _, _) | (_, _, Some(f), Some(v)) => Some((f, vec![v])),
                    _ => None,
                };
                if let Some((field, values)) = pair {
                    self.require(field, values);
                }
            }
            Expr::In(x, list) => {
                if let (Some(field), Expr::List(items)) = (activity_field(x), list.as_ref()) {
                    if let Some(values) = items.iter().map(literal).collect::<Option<Vec<_>>>() {
                        self.require(field, values);
                    }
                }
            }
            _ => {}
        }
    }

    /// Two requirements on one field both hold: keep the values in both.
    fn require(&mut self, field: &str, values: Vec<String>) {
        let slot = match field {
            "type" => &mut self.types,
            "resource" => &mut self.resources,
            "action" => &mut self.actions,
            _ => return,
        };
        *slot = Some(match slot.take() {
            None => values,
            Some(held) => held.into_iter().filter(|v| values.contains(v)).collect(),
        });
    }

    /// Whether an activity of this type, resource and action can satisfy the condition.
    pub fn admits(&self, activity_type: &str, resource: &str, action: &str) -> bool {
        let ok = |req: &Option<Vec<String>>, v: &str| req.as_ref().is_none_or(|vs| vs.iter().any(|x| x == v));
        ok(&self.types, activity_type) && ok(&self.resources, resource) && ok(&self.actions, action)
    }
}

/// `activity.<field>` → the field's name.
fn activity_field(e: &Expr) -> Option<&str> {
    match e {
        Expr::Member(root, field) if matches!(root.as_ref(), Expr::Ident(r) if r == "activity") => Some(field),
        _ => None,
    }
}

fn literal(e: &Expr) -> Option<String> {
    match e {
        Expr::Str(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_condition;

    fn scope(src: &str) -> Scope {
        Scope::of(&parse_condition(src).unwrap())
    }

    #[test]
    fn reads_requirements_from_top_level_conjuncts_only() {
        let s = scope("activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2' && wallet.id == 'w'");
        assert_eq!(s.types, Some(vec!["ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".to_string()]));
        assert!(s.admits("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "PRIVATE_KEY", "SIGN"));
        assert!(!s.admits("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "CREATE"));

        let s = scope("'PRIVATE_KEY' == activity.resource && activity.action in ['SIGN', 'EXPORT']");
        assert!(s.admits("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "PRIVATE_KEY", "SIGN"));
        assert!(!s.admits("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "PRIVATE_KEY", "DELETE"));
        assert!(!s.admits("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "SIGN"));

        // Two requirements on one field: only values in both.
        let s = scope("activity.type in ['A', 'B'] && activity.type == 'B'");
        assert_eq!(s.types, Some(vec!["B".to_string()]));

        // Anything else says nothing: a disjunction, a negation, a comparison that is not `==`.
        for src in [
            "activity.type == 'A' || wallet.id == 'w'",
            "!(activity.type == 'A')",
            "activity.type != 'A'",
            "activity.params.type == 'A'",
            "true",
        ] {
            assert!(scope(src).admits("X", "Y", "Z"), "{src}");
        }
    }
}
