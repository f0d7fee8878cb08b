//! Which binding wants which ClusterSPIFFEID name, to re-enqueue a binding refused because
//! a foreign object holds its name when that object goes away.
//!
//! A binding only ever claims its own output's name, [`cluster_spiffe_id_name`] of its
//! namespace and name, so the claims are kept by name alone: the name a binding claimed is
//! derived again when it is released (rarely: the binding is gone or deleted). Keeping the
//! other direction too held a second copy of every name and key, about 150 bytes per
//! binding of every spoke, to save a hash when a binding goes away. Looking names up
//! (every reconcile, every ClusterSPIFFEID event) stays a map read, never a scan.

use std::collections::HashMap;

use super::queue::ObjectKey;
use crate::compiler::output::cluster_spiffe_id_name;

/// ClusterSPIFFEID names and the binding that wants each; a binding claims one name, its own.
#[derive(Debug, Default)]
pub struct NameClaims {
    by_name: HashMap<String, ObjectKey>,
}

impl NameClaims {
    /// Records that `key` wants `name`, which must be its own output's name
    /// ([`cluster_spiffe_id_name`] of `key`); `name`'s previous claimant loses it.
    pub fn claim(&mut self, name: &str, key: &ObjectKey) {
        debug_assert_eq!(name, cluster_spiffe_id_name(&key.namespace, &key.name));
        if self.by_name.get(name) == Some(key) {
            return; // the usual case: the same claim as on the last reconcile
        }
        self.by_name.insert(name.to_string(), key.clone());
    }

    /// Forgets the name `key` claimed, unless another binding holds it now.
    pub fn release(&mut self, key: &ObjectKey) {
        let name = cluster_spiffe_id_name(&key.namespace, &key.name);
        if self.by_name.get(&name) == Some(key) {
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

    fn own(key: &ObjectKey) -> String {
        cluster_spiffe_id_name(&key.namespace, &key.name)
    }

    #[test]
    fn a_binding_holds_its_own_name_until_released() {
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        let mut c = NameClaims::default();
        c.claim(&own(&a), &a);
        c.claim(&own(&a), &a);
        assert_eq!(c.claimant(&own(&a)), Some(&a));
        assert_eq!(c.claimant(&own(&b)), None);
        assert_eq!(c.len(), 1);

        c.claim(&own(&b), &b);
        assert_eq!(c.claimant(&own(&b)), Some(&b));
        assert_eq!(c.len(), 2);

        // Releasing finds the name again from the key alone.
        c.release(&a);
        assert_eq!(c.claimant(&own(&a)), None);
        assert_eq!(
            c.claimant(&own(&b)),
            Some(&b),
            "a's release leaves b's claim"
        );
        c.release(&a);
        assert_eq!(c.len(), 1, "releasing twice is harmless");
        c.release(&b);
        assert!(c.is_empty());
    }

    /// Two keys whose names collide (impossible with the hash in the name, but the map
    /// must not let one release the other's claim).
    #[test]
    fn a_release_leaves_a_name_another_binding_holds() {
        let a = ObjectKey::new("ns", "a");
        let intruder = ObjectKey::new("other", "z");
        let mut c = NameClaims::default();
        c.claim(&own(&a), &a);
        // Written directly: `claim` only accepts a binding's own name.
        c.by_name.insert(own(&a), intruder.clone());
        c.release(&a);
        assert_eq!(c.claimant(&own(&a)), Some(&intruder));
    }
}
