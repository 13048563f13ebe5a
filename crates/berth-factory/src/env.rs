//! A snapshot of environment variables, taken once at the edge and passed down. `Debug` shows
//! names only: values may be secrets.

use std::collections::BTreeMap;
use std::fmt;

/// Environment variables by name.
#[derive(Clone, Default)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// An empty environment.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Builds from `(name, value)` pairs (the binary passes `std::env::vars()`).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        Environment {
            vars: vars.into_iter().collect(),
        }
    }

    /// Sets one variable.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.vars.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Whether the variable is set and non-empty.
    pub fn is_set(&self, name: &str) -> bool {
        self.vars.get(name).is_some_and(|v| !v.is_empty())
    }

    /// The value, for an adapter reading its own declared credential.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}

impl fmt::Debug for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Environment")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}
