//! One spelling per value of the configuration's choice enums: what `Display` writes,
//! `FromStr` reads (with the aliases older spellings keep working as), and serde writes and
//! reads.

/// lobster-cache's [`choice_names!`](lobster_cache::choice_names) and
/// [`choice_serde!`](lobster_cache::choice_serde) for a unit enum of the configuration: a name
/// that is none of the table's is [`Error::InvalidParameter`](crate::Error::InvalidParameter)
/// naming `$parameter` and the names `$allowed`.
macro_rules! names {
    ($ty:ident, $parameter:literal, $allowed:literal, { $($table:tt)+ }) => {
        lobster_cache::choice_names!(
            $ty,
            crate::error::Error,
            |other: &str| crate::error::Error::invalid($parameter, other, $allowed),
            { $($table)+ }
        );
        lobster_cache::choice_serde!($ty);
    };
}

#[cfg(test)]
mod tests {
    use std::fmt::{Debug, Display};
    use std::str::FromStr;

    use crate::{CachePolicy, IoOrder, PeerPlanChoice, PipelineThreads};

    fn round_trips<T: FromStr + Display + Debug + PartialEq + Copy>(all: &[T]) {
        for &v in all {
            assert_eq!(v.to_string().parse::<T>().ok(), Some(v), "{v:?}");
        }
        assert!("no-such-name".parse::<T>().is_err());
    }

    #[test]
    fn every_name_parses_back_to_its_value() {
        use CachePolicy::*;
        round_trips(&[None, Reuse, Lru, Static]);
        round_trips(&[IoOrder::Deadline, IoOrder::Shares]);
        round_trips(&[PipelineThreads::Batch, PipelineThreads::Normal]);
        round_trips(&[PeerPlanChoice::Auto, PeerPlanChoice::Node]);
    }

    #[test]
    fn older_policy_spellings_are_taken_and_the_canonical_one_written() {
        assert_eq!("nopfs".parse::<CachePolicy>().unwrap(), CachePolicy::Static);
        assert_eq!(
            "lobster".parse::<CachePolicy>().unwrap(),
            CachePolicy::Reuse
        );
        assert_eq!(CachePolicy::Static.to_string(), "static");
        assert_eq!(
            serde_json::to_string(&CachePolicy::Static).unwrap(),
            r#""static""#
        );
        let e = "belady".parse::<CachePolicy>().unwrap_err().to_string();
        assert!(e.contains("belady") && e.contains("cache policy"), "{e}");
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
        clap_agrees::<CachePolicy>();
        clap_agrees::<IoOrder>();
        clap_agrees::<PipelineThreads>();
        clap_agrees::<PeerPlanChoice>();
    }
}
