//! One spelling per value of the crate's choice enums: what `Display` writes, `FromStr`
//! reads (with the aliases older spellings keep working as), and serde writes and reads.

/// Implements `as_str`, `Display` and `FromStr` for a unit enum from one table: each
/// variant's canonical name, then the aliases a parser also accepts. `$err` makes the parse
/// error from the name given. Shared with lobster-io's configuration enums, so each spelling
/// rule is written once.
#[doc(hidden)]
#[macro_export]
macro_rules! choice_names {
    ($ty:ident, $err_ty:ty, $err:expr, {
        $($variant:ident => $name:literal $(| $alias:literal)*,)+
    }) => {
        impl $ty {
            /// The name [`FromStr`](std::str::FromStr) accepts and
            /// [`Display`](std::fmt::Display) writes.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $err_ty;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name $(| $alias)* => Ok($ty::$variant),)+
                    _ => Err($err(s)),
                }
            }
        }
    };
}

/// `Serialize` and `Deserialize` for an enum of [`choice_names!`]: its names, as `Display`
/// writes and `FromStr` reads them.
#[doc(hidden)]
#[macro_export]
macro_rules! choice_serde {
    ($ty:ident) => {
        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

/// [`choice_names!`], and serde with the `serde` feature.
macro_rules! names {
    ($ty:ident, $err_ty:ty, $err:expr, { $($table:tt)+ }) => {
        $crate::choice_names!($ty, $err_ty, $err, { $($table)+ });
        #[cfg(feature = "serde")]
        $crate::choice_serde!($ty);
    };
}

#[cfg(test)]
mod tests {
    use std::fmt::{Debug, Display};
    use std::str::FromStr;

    use crate::{Assign, FormChoice, PeerPlanKind, PolicyKind};

    fn round_trips<T: FromStr + Display + Debug + PartialEq + Copy>(all: &[T]) {
        for &v in all {
            assert_eq!(v.to_string().parse::<T>().ok(), Some(v), "{v:?}");
        }
        assert!("no-such-name".parse::<T>().is_err());
    }

    #[test]
    fn every_name_parses_back_to_its_value() {
        round_trips(&PolicyKind::ALL);
        round_trips(&FormChoice::ALL);
        round_trips(&[Assign::Sampler, Assign::Locality]);
        round_trips(&[PeerPlanKind::Node, PeerPlanKind::Cluster]);
    }

    #[test]
    fn older_policy_spellings_are_taken_and_the_canonical_one_written() {
        assert_eq!("nopfs".parse::<PolicyKind>().unwrap(), PolicyKind::Static);
        assert_eq!("lobster".parse::<PolicyKind>().unwrap(), PolicyKind::Reuse);
        assert_eq!(PolicyKind::Static.to_string(), "static");
        let e = "belady".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(e.contains("belady") && e.contains("static"), "{e}");
        let e = "near".parse::<Assign>().unwrap_err().to_string();
        assert!(e.contains("near") && e.contains("locality"), "{e}");
    }

    #[cfg(feature = "clap")]
    fn clap_agrees<T: clap::ValueEnum + Display + FromStr + Debug + PartialEq>() {
        for v in T::value_variants() {
            let possible = v.to_possible_value().unwrap();
            assert_eq!(possible.get_name(), v.to_string(), "{v:?}");
            for alias in possible.get_name_and_aliases() {
                assert_eq!(alias.parse::<T>().ok().as_ref(), Some(v), "{alias}");
            }
        }
    }

    #[cfg(feature = "clap")]
    #[test]
    fn clap_takes_the_same_names_and_aliases() {
        clap_agrees::<PolicyKind>();
        clap_agrees::<FormChoice>();
        clap_agrees::<Assign>();
        clap_agrees::<PeerPlanKind>();
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_writes_and_reads_the_same_names() {
        let json = serde_json::to_string(&[PeerPlanKind::Node, PeerPlanKind::Cluster]).unwrap();
        assert_eq!(json, r#"["node","cluster"]"#);
        let back: Vec<PolicyKind> = serde_json::from_str(r#"["static","nopfs"]"#).unwrap();
        assert_eq!(back, [PolicyKind::Static, PolicyKind::Static]);
        assert!(serde_json::from_str::<Assign>(r#""near""#).is_err());
    }
}
