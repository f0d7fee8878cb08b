//! The `kleym` binary.

fn main() {
    println!("kleym: nothing here yet");
}
