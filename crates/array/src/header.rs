//! The `.npy` header: the Python dict literal numpy writes, such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`, parsed by a small grammar of
//! exactly that, not by a Python evaluator: the three keys in any order, each once, in single
//! or double quotes; a string descr; `True` or `False`; a tuple of non-negative integers.
//! Whitespace may come between any two tokens, and the header ends with a newline.

use crate::error::ArrayError;

/// The three values of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) descr: String,
    pub(crate) fortran_order: bool,
    pub(crate) shape: Vec<u64>,
}

/// The bound on the dimensions of a shape: numpy's own maximum (`NPY_MAXDIMS`, 64 since
/// numpy 2.0).
pub const NDIM_MAX: usize = 64;

/// How much of a descr that is not a string (a structured dtype's list) an error quotes.
const DESCR_QUOTED_BYTES_MAX: usize = 120;

/// Parses `text`, the header after the length field. `base` is its offset in the file, for
/// errors. `long_ints` accepts Python 2's `3L` in the shape, as numpy does for headers of
/// versions 1.0 and 2.0 (which Python 2 may have written).
pub(crate) fn parse(text: &[u8], base: u64, long_ints: bool) -> Result<Header, ArrayError> {
    let mut p = Parser {
        text,
        at: 0,
        base,
        long_ints,
    };
    if text.last() != Some(&b'\n') {
        return Err(p.error_at(text.len(), "the header does not end with a newline"));
    }
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    p.skip_space();
    p.expect(b'{', "the header does not start with '{'")?;
    loop {
        p.skip_space();
        if p.eat(b'}') {
            break;
        }
        let key_at = p.at;
        let key = p.string()?;
        p.skip_space();
        p.expect(b':', "no ':' after a key")?;
        p.skip_space();
        let duplicate = match key {
            b"descr" => descr.replace(p.descr()?).is_some(),
            b"fortran_order" => fortran_order.replace(p.boolean()?).is_some(),
            b"shape" => shape.replace(p.tuple()?).is_some(),
            _ => {
                let reason = format!("unknown key {:?}", String::from_utf8_lossy(key));
                return Err(p.error_at(key_at, &reason));
            }
        };
        if duplicate {
            let reason = format!("the key {:?} twice", String::from_utf8_lossy(key));
            return Err(p.error_at(key_at, &reason));
        }
        p.skip_space();
        if p.eat(b'}') {
            break;
        }
        p.expect(b',', "no ',' or '}' after a value")?;
    }
    p.skip_space();
    if p.at != text.len() {
        return Err(p.error("bytes after the dict"));
    }
    match (descr, fortran_order, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Header {
            descr,
            fortran_order,
            shape,
        }),
        (None, ..) => Err(p.error("no 'descr' key")),
        (_, None, _) => Err(p.error("no 'fortran_order' key")),
        (.., None) => Err(p.error("no 'shape' key")),
    }
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    base: u64,
    long_ints: bool,
}

impl<'a> Parser<'a> {
    fn error(&self, reason: &str) -> ArrayError {
        self.error_at(self.at, reason)
    }

    fn error_at(&self, at: usize, reason: &str) -> ArrayError {
        ArrayError::Header {
            offset: self.base.saturating_add(at as u64),
            reason: reason.to_string(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    fn expect(&mut self, byte: u8, reason: &str) -> Result<(), ArrayError> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A quoted string of printable ASCII without escapes (no key or simple descr has one).
    fn string(&mut self) -> Result<&'a [u8], ArrayError> {
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(self.error("not a quoted string")),
        };
        let start = self.at + 1;
        let mut end = start;
        loop {
            match self.text.get(end) {
                Some(&b) if b == quote => break,
                Some(b'\\') => return Err(self.error_at(end, "an escape in a string")),
                Some(b' '..=b'~') => end += 1,
                Some(_) => {
                    return Err(self.error_at(end, "a byte other than printable ASCII"));
                }
                None => return Err(self.error("an unterminated string")),
            }
        }
        self.at = end + 1;
        Ok(&self.text[start..end])
    }

    /// The descr: a string, or the start of a structured dtype's list (or a dict, or a tuple),
    /// which is refused quoting it.
    fn descr(&mut self) -> Result<String, ArrayError> {
        if matches!(self.peek(), Some(b'[' | b'(' | b'{')) {
            return Err(ArrayError::UnsupportedDescr {
                descr: self.bracketed(),
            });
        }
        let descr = self.string()?;
        // string() lets only printable ASCII through.
        Ok(String::from_utf8_lossy(descr).into_owned())
    }

    /// The text of the bracketed value at `at`, up to its closing bracket (brackets in strings
    /// not counted) or the end of the text, cut at [`DESCR_QUOTED_BYTES_MAX`].
    fn bracketed(&self) -> String {
        let rest = self.text.get(self.at..).unwrap_or_default();
        let (mut depth, mut quote, mut end) = (0usize, None, rest.len());
        for (i, &b) in rest.iter().enumerate() {
            match (quote, b) {
                (Some(q), _) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'\'' | b'"') => quote = Some(b),
                (None, b'[' | b'(' | b'{') => depth += 1,
                (None, b']' | b')' | b'}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let quoted = &rest[..end.min(DESCR_QUOTED_BYTES_MAX)];
        let mut descr = String::from_utf8_lossy(quoted).into_owned();
        if end > DESCR_QUOTED_BYTES_MAX {
            descr.push_str("...");
        }
        descr
    }

    fn boolean(&mut self) -> Result<bool, ArrayError> {
        let rest = self.text.get(self.at..).unwrap_or_default();
        let (value, len) = if rest.starts_with(b"True") {
            (true, 4)
        } else if rest.starts_with(b"False") {
            (false, 5)
        } else {
            return Err(self.error("fortran_order is not True or False"));
        };
        // `Truest` is a name, not True.
        if rest
            .get(len)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            return Err(self.error("fortran_order is not True or False"));
        }
        self.at += len;
        Ok(value)
    }

    /// `()`, `(5,)`, `(3, 4)` or `(3, 4,)`: `(5)` is an integer to Python, not a tuple.
    fn tuple(&mut self) -> Result<Vec<u64>, ArrayError> {
        self.expect(b'(', "the shape is not a tuple")?;
        let mut shape = Vec::new();
        let mut comma_after_last = false;
        loop {
            self.skip_space();
            if self.eat(b')') {
                break;
            }
            if shape.len() == NDIM_MAX {
                return Err(ArrayError::TooManyDims { ndim_max: NDIM_MAX });
            }
            shape.push(self.integer()?);
            self.skip_space();
            comma_after_last = self.eat(b',');
            if !comma_after_last {
                self.expect(b')', "no ',' or ')' after a dimension")?;
                break;
            }
        }
        if shape.len() == 1 && !comma_after_last {
            return Err(self.error("a one-dimension shape without its comma, as (5,)"));
        }
        Ok(shape)
    }

    /// A decimal integer as Python writes it: no sign, no leading zero but in `0`.
    fn integer(&mut self) -> Result<u64, ArrayError> {
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            if self.at > start && value == 0 {
                return Err(self.error("a dimension with a leading zero"));
            }
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
                .ok_or_else(|| self.error_at(start, "a dimension past 64 bits"))?;
            self.at += 1;
        }
        if self.at == start {
            return Err(self.error("a dimension that is not a non-negative integer"));
        }
        if self.long_ints && matches!(self.peek(), Some(b'L' | b'l')) {
            self.at += 1;
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Header {
        parse(text.as_bytes(), 10, false).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn header_error(text: &str) -> (u64, String) {
        match parse(text.as_bytes(), 10, false) {
            Err(ArrayError::Header { offset, reason }) => (offset, reason),
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn the_dict_numpy_writes_parses() {
        let h = ok("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }      \n");
        assert_eq!(
            h,
            Header {
                descr: "<f4".into(),
                fortran_order: false,
                shape: vec![3, 4]
            }
        );
    }

    #[test]
    fn keys_in_any_order_quotes_and_spacing_parse() {
        let h = ok("{\"shape\":(5,),\"fortran_order\":True,\"descr\":\"|u1\"}\n");
        assert_eq!(h.shape, vec![5]);
        assert!(h.fortran_order);
        assert_eq!(h.descr, "|u1");
        let h = ok(" {\n 'fortran_order' : False ,\t'shape' : ( ) , 'descr' : '>i8' } \n");
        assert!(h.shape.is_empty());
        assert_eq!(
            ok("{'descr':'<f8','fortran_order':False,'shape':(0,7,)}\n").shape,
            [0, 7]
        );
    }

    #[test]
    fn python2_long_integers_parse_only_when_allowed() {
        let text = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }\n";
        assert_eq!(parse(text, 10, true).unwrap().shape, [3, 4]);
        assert!(parse(text, 10, false).is_err());
    }

    #[test]
    fn malformed_headers_are_refused_at_their_offset() {
        let cases = [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                "newline",
            ),
            ("['descr']\n", "start with '{'"),
            ("{'descr': '<f4', 'fortran_order': False}\n", "no 'shape'"),
            ("{'fortran_order': False, 'shape': ()}\n", "no 'descr'"),
            ("{'descr': '<f4', 'shape': ()}\n", "no 'fortran_order'"),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}\n",
                "twice",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}\n",
                "unknown key",
            ),
            ("{descr: '<f4'}\n", "quoted"),
            ("{'descr' '<f4'}\n", "':'"),
            ("{'descr': '<f4' 'shape': ()}\n", "','"),
            ("{'descr': '<\\f4'}\n", "escape"),
            ("{'descr': '<f4\n", "printable"),
            ("{'descr': '<f4", "newline"),
            ("{'descr': 3}\n", "quoted"),
            ("{'fortran_order': 0}\n", "True or False"),
            ("{'fortran_order': Truest}\n", "True or False"),
            ("{'fortran_order': false}\n", "True or False"),
            ("{'shape': [3]}\n", "not a tuple"),
            ("{'shape': (5)}\n", "comma"),
            ("{'shape': (-5,)}\n", "non-negative"),
            ("{'shape': (05,)}\n", "leading zero"),
            ("{'shape': (3 4)}\n", "',' or ')'"),
            ("{'shape': (3,,)}\n", "non-negative"),
            ("{'shape': (18446744073709551616,)}\n", "64 bits"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x\n",
                "after the dict",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': ()}}\n",
                "after the dict",
            ),
        ];
        for (text, reason) in cases {
            let (offset, got) = header_error(text);
            assert!(got.contains(reason), "{text:?}: {got}");
            assert!((10..=10 + text.len() as u64).contains(&offset), "{text:?}");
        }
        // The offset is that of the faulty token.
        assert_eq!(header_error("{'shape': (05,)}\n").0, 10 + 12);
    }

    #[test]
    fn a_structured_descr_is_refused_quoting_it() {
        let text =
            "{'descr': [('a', '<f4'), ('b]', '<i2')], 'fortran_order': False, 'shape': (2,)}\n";
        assert_eq!(
            parse(text.as_bytes(), 10, false),
            Err(ArrayError::UnsupportedDescr {
                descr: "[('a', '<f4'), ('b]', '<i2')]".into()
            })
        );
        let long = format!("{{'descr': [{}\n", "('a', '<f4'), ".repeat(20));
        match parse(long.as_bytes(), 10, false) {
            Err(ArrayError::UnsupportedDescr { descr }) => {
                assert_eq!(descr.len(), DESCR_QUOTED_BYTES_MAX + 3);
                assert!(descr.ends_with("..."));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn more_dimensions_than_the_bound_are_refused() {
        let dims = |n: usize| {
            format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}\n",
                "1, ".repeat(n)
            )
        };
        assert_eq!(ok(&dims(NDIM_MAX)).shape.len(), NDIM_MAX);
        assert_eq!(
            parse(dims(NDIM_MAX + 1).as_bytes(), 10, false),
            Err(ArrayError::TooManyDims { ndim_max: NDIM_MAX })
        );
    }
}
