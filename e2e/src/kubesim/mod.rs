//! kubesim: a Kubernetes API simulator (see the crate docs and `kubesim --help`).
