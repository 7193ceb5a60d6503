//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the files it sees at
//! compile time, and cargo would not otherwise notice a new file in the directory.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
