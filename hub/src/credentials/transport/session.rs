//! TLS resumption for one spoke client: the tickets of the one server it talks to.
//!
//! rustls' `ClientSessionMemoryCache` allocates up front for eight tickets per server and a
//! map of servers (about 3 KB per spoke client in heaptrack, for a client that reaches one
//! server and reconnects only after a `GOAWAY` or a dead connection). This store keeps the
//! last [`MAX_TICKETS`] TLS 1.3 tickets and one TLS 1.2 session, allocated when they
//! arrive, and only for the server they came from: a ticket is never offered to another
//! server name. It is never shared between spoke clients (a resumed session carries the
//! client identity it was made with).

use std::collections::VecDeque;
use std::sync::Mutex;

use rustls::NamedGroup;
use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;

/// TLS 1.3 tickets kept (servers send one or two per handshake; each is used once).
pub(super) const MAX_TICKETS: usize = 2;

/// The resumption state of one spoke client.
#[derive(Debug, Default)]
pub(super) struct SpokeSessions(Mutex<Option<Server>>);

#[derive(Debug)]
struct Server {
    name: ServerName<'static>,
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl SpokeSessions {
    /// Runs `f` on the state of `name`, starting afresh when it is another server's.
    fn edit(&self, name: ServerName<'static>, f: impl FnOnce(&mut Server)) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let server = match slot.as_mut() {
            Some(server) if server.name == name => server,
            _ => slot.insert(Server {
                name,
                kx_hint: None,
                tls12: None,
                tls13: VecDeque::new(),
            }),
        };
        f(server);
    }

    /// Reads (or takes from) the state of `name`, if it is the one kept.
    fn read<T>(
        &self,
        name: &ServerName<'_>,
        f: impl FnOnce(&mut Server) -> Option<T>,
    ) -> Option<T> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_mut().filter(|s| s.name == *name).and_then(f)
    }
}

impl ClientSessionStore for SpokeSessions {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.edit(server_name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.read(server_name, |s| s.kx_hint)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.edit(server_name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.read(server_name, |s| s.tls12.clone())
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.read(server_name, |s| s.tls12.take());
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.edit(server_name, |s| {
            if s.tls13.len() == MAX_TICKETS {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        // Newest first, as rustls' own cache does.
        self.read(server_name, |s| s.tls13.pop_back())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ServerName<'static> {
        ServerName::try_from(s.to_string()).unwrap()
    }

    #[test]
    fn hints_belong_to_the_server_they_came_from() {
        let store = SpokeSessions::default();
        assert_eq!(store.kx_hint(&name("a.example")), None);
        store.set_kx_hint(name("a.example"), NamedGroup::X25519);
        assert_eq!(store.kx_hint(&name("a.example")), Some(NamedGroup::X25519));
        assert_eq!(store.kx_hint(&name("b.example")), None);
        // Another server replaces the state: nothing of the first is offered to it.
        store.set_kx_hint(name("b.example"), NamedGroup::secp256r1);
        assert_eq!(store.kx_hint(&name("a.example")), None);
        assert_eq!(
            store.kx_hint(&name("b.example")),
            Some(NamedGroup::secp256r1)
        );
        assert!(store.take_tls13_ticket(&name("b.example")).is_none());
    }
}
