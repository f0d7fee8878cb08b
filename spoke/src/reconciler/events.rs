//! Kubernetes events (`events.k8s.io/v1`) on verdict *transitions*: a refusal appears
//! (Warning, reason = the refusal reason), changes, or is resolved (Normal
//! `Resolved`/`IdentityCollisionResolved`), and the first time output is applied. Never on
//! a resync that changes nothing. Publishing failures are logged, never fatal.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// What happened to a binding's verdict between the recorded and the new status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing worth an event.
    None,
    /// A refusal now holds (new or different from the recorded one).
    Refused {
        /// Stable reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// A recorded refusal no longer holds.
    Resolved {
        /// The reason that no longer holds.
        previous_reason: String,
    },
}

/// Decides the event from the recorded `(condition, reason)` refusal and the new one.
pub fn transition(
    recorded: Option<(String, String)>,
    new: Option<(&str, &str, &str)>,
) -> Transition {
    match (recorded, new) {
        (None, None) => Transition::None,
        (Some((_, prev)), None) => Transition::Resolved {
            previous_reason: prev,
        },
        (Some((pc, pr)), Some((c, r, _))) if pc == c && pr == r => Transition::None,
        (_, Some((_, r, m))) => Transition::Refused {
            reason: r.to_string(),
            message: m.to_string(),
        },
    }
}

/// Publishes events for one spoke.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
    enabled: bool,
}

impl EventPublisher {
    /// A publisher; `enabled = false` publishes nothing.
    pub fn new(client: kube::Client, reporter: Reporter, enabled: bool) -> Self {
        Self {
            recorder: Recorder::new(client, reporter),
            enabled,
        }
    }

    /// Publishes the event for `t` about `regarding` (best effort).
    pub async fn publish(&self, regarding: &ObjectReference, t: &Transition) {
        if !self.enabled {
            return;
        }
        let ev = match t {
            Transition::None => return,
            Transition::Refused { reason, message } => Event {
                type_: EventType::Warning,
                reason: truncate(reason, 128),
                note: Some(truncate(message, 1024)),
                action: "Refuse".into(),
                secondary: None,
            },
            Transition::Resolved { previous_reason } => Event {
                type_: EventType::Normal,
                reason: truncate(&format!("{previous_reason}Resolved"), 128),
                note: Some(truncate(
                    &format!("{previous_reason} no longer holds; the identity is registered"),
                    1024,
                )),
                action: "Resolve".into(),
                secondary: None,
            },
        };
        self.send(regarding, ev).await;
    }

    /// Publishes a Warning event `reason` with `note` about `regarding` (best effort): for
    /// what is worth telling once but is not a verdict transition (an untrusted status
    /// record, a foreign object left in place on deletion).
    pub async fn warn(&self, regarding: &ObjectReference, reason: &str, note: &str) {
        if !self.enabled {
            return;
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: truncate(reason, 128),
            note: Some(truncate(note, 1024)),
            action: "Refuse".into(),
            secondary: None,
        };
        self.send(regarding, ev).await;
    }

    async fn send(&self, regarding: &ObjectReference, ev: Event) {
        if let Err(err) = self.recorder.publish(&ev, regarding).await {
            tracing::warn!(
                binding = regarding.name.as_deref().unwrap_or_default(),
                namespace = regarding.namespace.as_deref().unwrap_or_default(),
                error = %err,
                "could not publish event"
            );
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(c: &str, r: &str) -> Option<(String, String)> {
        Some((c.into(), r.into()))
    }

    #[test]
    fn unchanged_refusal_and_steady_ready_publish_nothing() {
        assert_eq!(transition(None, None), Transition::None);
        assert_eq!(
            transition(
                rec("Conflict", "IdentityCollision"),
                Some(("Conflict", "IdentityCollision", "m"))
            ),
            Transition::None
        );
    }

    #[test]
    fn new_or_changed_refusal_warns_and_resolution_is_normal() {
        assert!(matches!(
            transition(None, Some(("Conflict", "IdentityCollision", "m"))),
            Transition::Refused { reason, .. } if reason == "IdentityCollision"
        ));
        assert!(matches!(
            transition(
                rec("InvalidRef", "ObjectiveNotFound"),
                Some(("Conflict", "IdentityCollision", "m"))
            ),
            Transition::Refused { .. }
        ));
        assert_eq!(
            transition(rec("Conflict", "IdentityCollision"), None),
            Transition::Resolved {
                previous_reason: "IdentityCollision".into()
            }
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
