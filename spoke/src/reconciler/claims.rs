//! Which binding wants which ClusterSPIFFEID name, to re-enqueue a binding refused because
//! a foreign object holds its name when that object goes away.
//!
//! Indexed both ways: every reconcile records its binding's claim, and a scan of every
//! claim of the spoke per reconcile made that quadratic in the spoke's bindings.

use std::collections::HashMap;

use super::queue::ObjectKey;

/// ClusterSPIFFEID names and the binding that wants each; a binding claims one name at most.
#[derive(Debug, Default)]
pub struct NameClaims {
    by_name: HashMap<String, ObjectKey>,
    by_key: HashMap<ObjectKey, String>,
}

impl NameClaims {
    /// Records that `key` wants `name` (and no other); `name`'s previous claimant loses it.
    pub fn claim(&mut self, name: &str, key: &ObjectKey) {
        if self.by_key.get(key).is_some_and(|n| n == name) {
            return; // the usual case: the same claim as on the last reconcile
        }
        self.release(key);
        if let Some(previous) = self.by_name.insert(name.to_string(), key.clone()) {
            self.by_key.remove(&previous);
        }
        self.by_key.insert(key.clone(), name.to_string());
    }

    /// Forgets the name `key` claimed.
    pub fn release(&mut self, key: &ObjectKey) {
        if let Some(name) = self.by_key.remove(key) {
            self.by_name.remove(&name);
        }
    }

    /// The binding that wants `name`, if any.
    pub fn claimant(&self, name: &str) -> Option<&ObjectKey> {
        self.by_name.get(name)
    }

    /// Number of claimed names.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when nothing is claimed.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_holds_one_name_and_a_name_one_binding() {
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        let mut c = NameClaims::default();
        c.claim("x", &a);
        c.claim("x", &a);
        assert_eq!(c.claimant("x"), Some(&a));
        assert_eq!(c.len(), 1);

        // A new name replaces the old one.
        c.claim("y", &a);
        assert_eq!(c.claimant("x"), None);
        assert_eq!(c.claimant("y"), Some(&a));
        assert_eq!(c.len(), 1);

        // Another binding taking the name: the first one claims nothing any more.
        c.claim("y", &b);
        assert_eq!(c.claimant("y"), Some(&b));
        c.release(&a);
        assert_eq!(c.claimant("y"), Some(&b), "a's release leaves b's claim");
        c.claim("z", &a);
        assert_eq!(c.claimant("y"), Some(&b));
        assert_eq!(c.len(), 2);

        c.release(&b);
        c.release(&a);
        assert!(c.is_empty());
    }
}
