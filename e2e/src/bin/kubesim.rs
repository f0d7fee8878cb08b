//! `kubesim`: serve simulated Kubernetes clusters on 127.0.0.1.

fn main() {
    println!("kubesim: nothing here yet");
}
