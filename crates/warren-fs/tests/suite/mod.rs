//! Test modules, and the macro that runs a test body under both resolvers.

/// For each named `fn name(r: Resolver)` of the calling module, defines a module `name` with two
/// tests, `with_openat2` and `with_nofollow_walk`, each calling the function with that resolver.
/// Test names then read as sentences:
/// `symlink_in_middle_component_is_refused::with_openat2`.
macro_rules! for_both_resolvers {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn with_openat2() {
                    super::$name(warren_fs::Resolver::Openat2)
                }

                #[test]
                fn with_nofollow_walk() {
                    super::$name(warren_fs::Resolver::NoFollowWalk)
                }
            }
        )+
    };
}

mod attacks;
mod bytes;
mod concurrency;
mod edit;
mod listing;
mod mounts;
mod open;
mod ownership;
mod race;
mod read;
mod remove;
mod search;
mod support;
mod tree;
mod write;
