//! `labelled!`: a closed set of stored names (outcomes, causes, run kinds…). Each set is stored
//! in tables and exported as metric labels, so it is small, fixed and spelled in one place.

/// Declares a closed set of stored names (outcomes, causes, run kinds…): the enum, `ALL`,
/// `index`, `as_str`, `parse`, `Display` and `Serialize` (as the stored name).
macro_rules! labelled {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order (for metrics that start at 0).
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The position in [`Self::ALL`], for per-value counters kept in arrays.
            pub fn index(self) -> usize {
                self as usize
            }

            /// The stored and exported name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }

            /// Reads a stored name back.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($label => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use labelled;
