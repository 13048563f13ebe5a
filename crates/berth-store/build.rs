//! The migrations are embedded at compile time (`sqlx::migrate!`); without this, adding one
//! would not rebuild the crate, and a stale binary would refuse a store a fresh one migrated.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
