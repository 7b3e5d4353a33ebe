//! The element types an array may hold: numpy's simple scalar descrs.

use std::fmt;

use crate::error::ArrayError;

/// What an element is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// numpy `bool` (`b1`, `?`): one byte, 0 or 1.
    Bool,
    /// Signed integer (`i1`, `i2`, `i4`, `i8`).
    Int,
    /// Unsigned integer (`u1`, `u2`, `u4`, `u8`).
    Uint,
    /// IEEE float (`f2`, `f4`, `f8`).
    Float,
    /// A pair of IEEE floats, real then imaginary (`c8`, `c16`).
    Complex,
}

impl Kind {
    /// numpy's kind character: `b`, `i`, `u`, `f` or `c`.
    pub fn code(self) -> char {
        match self {
            Kind::Bool => 'b',
            Kind::Int => 'i',
            Kind::Uint => 'u',
            Kind::Float => 'f',
            Kind::Complex => 'c',
        }
    }
}

/// The order of an element's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    Little,
    Big,
    /// One-byte elements (numpy's `|`).
    NotApplicable,
}

impl ByteOrder {
    /// This machine's order.
    pub const NATIVE: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };
}

/// An element type: kind, size and byte order, in the canonical form numpy gives it, so two
/// descrs numpy reads as one dtype (`=f4` and `<f4` here, `<u1` and `|u1`) compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    kind: Kind,
    item_bytes: u8,
    order: ByteOrder,
}

impl DType {
    /// Parses a simple numpy descr: an optional byte order (`<`, `>`, `|`, `=`; none or `|`
    /// on a multi-byte type means this machine's, as numpy reads it) and one of `b1`, `?`,
    /// `i1`..`i8`, `u1`..`u8`, `f2`, `f4`, `f8`, `c8`, `c16`. Anything else is refused,
    /// naming the descr.
    pub fn from_descr(descr: &str) -> Result<DType, ArrayError> {
        let unsupported = || ArrayError::UnsupportedDescr {
            descr: descr.to_string(),
        };
        let (order, rest) = match descr.as_bytes().first() {
            Some(b'<') => (Some(ByteOrder::Little), &descr[1..]),
            Some(b'>') => (Some(ByteOrder::Big), &descr[1..]),
            Some(b'|' | b'=') => (None, &descr[1..]),
            _ => (None, descr),
        };
        let (kind, item_bytes) = match rest {
            "?" | "b1" => (Kind::Bool, 1),
            "i1" => (Kind::Int, 1),
            "i2" => (Kind::Int, 2),
            "i4" => (Kind::Int, 4),
            "i8" => (Kind::Int, 8),
            "u1" => (Kind::Uint, 1),
            "u2" => (Kind::Uint, 2),
            "u4" => (Kind::Uint, 4),
            "u8" => (Kind::Uint, 8),
            "f2" => (Kind::Float, 2),
            "f4" => (Kind::Float, 4),
            "f8" => (Kind::Float, 8),
            "c8" => (Kind::Complex, 8),
            "c16" => (Kind::Complex, 16),
            _ => return Err(unsupported()),
        };
        let order = if item_bytes == 1 {
            ByteOrder::NotApplicable
        } else {
            order.unwrap_or(ByteOrder::NATIVE)
        };
        Ok(DType {
            kind,
            item_bytes,
            order,
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Bytes of one element (of both parts, for complex).
    pub fn item_bytes(&self) -> usize {
        usize::from(self.item_bytes)
    }

    pub fn byte_order(&self) -> ByteOrder {
        self.order
    }

    /// Whether the elements' bytes are in this machine's order (or are single bytes).
    pub fn is_native_order(&self) -> bool {
        self.order == ByteOrder::NotApplicable || self.order == ByteOrder::NATIVE
    }

    /// numpy's descr for this dtype (`dtype.str`), such as `<f4` or `|u1`:
    /// `numpy.dtype(descr)` rebuilds it.
    pub fn descr(&self) -> String {
        let order = match self.order {
            ByteOrder::Little => '<',
            ByteOrder::Big => '>',
            ByteOrder::NotApplicable => '|',
        };
        format!("{order}{}{}", self.kind.code(), self.item_bytes)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.descr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_simple_descr_parses_and_round_trips() {
        for descr in [
            "|b1", "|i1", "|u1", "<i2", ">i2", "<u2", "<i4", "<u4", "<i8", ">u8", "<f2", "<f4",
            ">f8", "<c8", ">c16",
        ] {
            let dtype = DType::from_descr(descr).unwrap();
            assert_eq!(dtype.descr(), descr);
            assert_eq!(DType::from_descr(&dtype.descr()), Ok(dtype));
        }
    }

    #[test]
    fn descrs_numpy_reads_as_one_dtype_compare_equal() {
        let native = if cfg!(target_endian = "big") {
            '>'
        } else {
            '<'
        };
        let f4 = DType::from_descr(&format!("{native}f4")).unwrap();
        for same in ["=f4", "|f4", "f4"] {
            assert_eq!(DType::from_descr(same), Ok(f4), "{same}");
        }
        assert!(f4.is_native_order());
        let b1 = DType::from_descr("|b1").unwrap();
        for same in ["?", "|?", "<b1", ">b1", "b1"] {
            assert_eq!(DType::from_descr(same), Ok(b1), "{same}");
        }
        assert_eq!(DType::from_descr(">u1").unwrap().descr(), "|u1");
        assert_eq!(b1.kind(), Kind::Bool);
        assert_eq!(DType::from_descr(">c16").unwrap().item_bytes(), 16);
        assert_eq!(
            DType::from_descr(">c16").unwrap().byte_order(),
            ByteOrder::Big
        );
    }

    #[test]
    fn other_descrs_are_refused_by_name() {
        for descr in [
            "", "<", "|O", "<U3", "|S5", "<M8[ns]", "<m8", "<f16", "<c32", "<i3", "|V8", "<<f4",
            "<f4 ", "float32", "<b2",
        ] {
            let e = DType::from_descr(descr).unwrap_err();
            assert_eq!(
                e,
                ArrayError::UnsupportedDescr {
                    descr: descr.to_string()
                }
            );
            assert!(e.to_string().contains(&format!("{descr:?}")));
        }
    }
}
