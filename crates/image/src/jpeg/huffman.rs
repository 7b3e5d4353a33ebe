//! Huffman tables and the entropy-coded bit reader of a baseline scan.

/// Bits looked up at once: codes up to this long decode with one table read.
const FAST_BITS: u32 = 11;
const FAST_SIZE: usize = 1 << FAST_BITS;

/// Set in an AC lookup entry whose code ends the block: the one symbol a block's loop exits
/// on, read with the others' single load.
const END_OF_BLOCK: i32 = 1 << 12;
/// Set in an AC lookup entry whose code fits the lookup but whose value does not: the entry
/// holds size << 16 in the value's place, and the value's bits follow the code's.
const VALUE_AFTER: i32 = 1 << 13;
/// The run of zeros in a lookup entry (bits 8 to 11).
const RUN: i32 = 15 << 8;

/// The JPEG zigzag order: coefficient k of a scan is natural index `ZIGZAG[k]`. Past 63
/// (a corrupt run) lands on a spare slot the inverse DCT never reads.
pub(super) const ZIGZAG: [u8; 80] = {
    let order: [u8; 64] = [
        0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27,
        20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
        58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    ];
    let mut all = [64u8; 80];
    let mut i = 0;
    while i < 64 {
        all[i] = order[i];
        i += 1;
    }
    all
};

/// One Huffman table, built in place from a DHT segment.
#[derive(Clone)]
pub(super) struct Table {
    /// By the next `FAST_BITS` bits: code length << 8 | symbol, or 0 for a longer code.
    fast: [u16; FAST_SIZE],
    /// By the next bits, for AC tables: a whole (run, size, value) when the code and its
    /// value fit in `FAST_BITS`: value << 16 | run << 8 | bits used, `END_OF_BLOCK` set for
    /// the end of block; for a code that fits without its value, size << 16 | run << 8 |
    /// `VALUE_AFTER` | code length; 0 for a longer code.
    ac: [i32; FAST_SIZE],
    /// The largest code of each length (index 1..=16), -1 if none.
    max_code: [i32; 18],
    /// Symbol index minus code, by length.
    offset: [i32; 17],
    symbols: [u8; 256],
    /// Whether the image being read defined this table.
    pub(super) defined: bool,
    /// The counts and symbols the lookups were last built from, whole (`built`): an image
    /// that defines the same table again (most encoders write the same few) reuses them.
    source: [u8; 16 + 256],
    source_len: usize,
    built: bool,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            fast: [0; FAST_SIZE],
            ac: [0; FAST_SIZE],
            max_code: [-1; 18],
            offset: [0; 17],
            symbols: [0; 256],
            defined: false,
            source: [0; 16 + 256],
            source_len: 0,
            built: false,
        }
    }
}

impl Table {
    /// Builds the table from the 16 counts of codes by length and the symbols.
    pub(super) fn build(&mut self, counts: &[u8; 16], symbols: &[u8]) -> Result<(), String> {
        let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
        if total > 256 || total != symbols.len() {
            return Err(format!("a Huffman table of {total} codes"));
        }
        let source_len = 16 + total;
        if self.built
            && self.source_len == source_len
            && self.source[..16] == counts[..]
            && self.source[16..source_len] == *symbols
        {
            self.defined = true;
            return Ok(());
        }
        // Rebuilt from here on: a failure below leaves the lookups half written.
        self.built = false;
        self.symbols[..total].copy_from_slice(symbols);
        self.fast.fill(0);
        self.ac.fill(0);
        let mut code: i32 = 0;
        let mut k: i32 = 0;
        for len in 1..=16usize {
            let n = i32::from(counts[len - 1]);
            self.offset[len] = k - code;
            if n > 0 {
                for _ in 0..n {
                    if code >= 1 << len {
                        return Err(format!("an overfull Huffman table at length {len}"));
                    }
                    if len as u32 <= FAST_BITS {
                        let shift = FAST_BITS - len as u32;
                        let start = (code as usize) << shift;
                        let entry = (len as u16) << 8 | u16::from(self.symbols[k as usize]);
                        self.fast[start..start + (1 << shift)].fill(entry);
                    }
                    code += 1;
                    k += 1;
                }
                self.max_code[len] = code - 1;
            } else {
                self.max_code[len] = -1;
            }
            code <<= 1;
        }
        self.max_code[17] = i32::MAX;
        for (i, &entry) in self.fast.iter().enumerate() {
            if entry == 0 {
                continue;
            }
            let len = u32::from(entry >> 8);
            let symbol = entry & 0xFF;
            let (run, size) = (u32::from(symbol >> 4), u32::from(symbol & 15));
            if size == 0 {
                // The end of block, or a run of 16 zeros (written as one zero, harmlessly).
                self.ac[i] = match run {
                    0 => END_OF_BLOCK | len as i32,
                    15 => (15 << 8 | len) as i32,
                    _ => 0,
                };
                continue;
            }
            if len + size > FAST_BITS {
                self.ac[i] = (size << 16 | run << 8 | len) as i32 | VALUE_AFTER;
                continue;
            }
            let bits = ((i as u32) >> (FAST_BITS - len - size)) & ((1 << size) - 1);
            let value = extend(bits, size);
            self.ac[i] = value << 16 | (run << 8 | (len + size)) as i32;
        }
        self.source[..16].copy_from_slice(counts);
        self.source[16..source_len].copy_from_slice(symbols);
        self.source_len = source_len;
        self.built = true;
        self.defined = true;
        Ok(())
    }
}

/// The signed value of `size` bits as the JPEG's magnitude categories code it.
#[inline(always)]
fn extend(bits: u32, size: u32) -> i32 {
    if size == 0 {
        0
    } else if bits < 1 << (size - 1) {
        bits as i32 - (1 << size) + 1
    } else {
        bits as i32
    }
}

/// Reads the entropy-coded bytes of a scan, most significant bit first, unstuffing 0xFF00.
/// A marker (or the end of the bytes) stops the reading: zeros are fed past it, counted, so
/// that a scan reading past its data is told apart from one that ends where it should.
pub(super) struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
    /// The bits, first at the top; `count` of them valid.
    acc: u64,
    count: u32,
    /// Zero bits fed past a marker since the last restart.
    fed_bits: u32,
}

impl<'a> Bits<'a> {
    pub(super) fn new(data: &'a [u8], pos: usize) -> Self {
        Bits {
            data,
            pos,
            acc: 0,
            count: 0,
            fed_bits: 0,
        }
    }

    /// Where the next unread byte is.
    pub(super) fn position(&self) -> usize {
        self.pos
    }

    /// Whether more bits were taken than the scan's data held before a marker.
    pub(super) fn overran(&self) -> bool {
        self.fed_bits > self.count
    }

    #[inline(always)]
    fn refill(&mut self) {
        // Fast: the next eight bytes hold no 0xFF, so they go in as they are. Bits past a
        // whole byte land below the valid ones; the next refill puts the same bits there.
        if let Some(chunk) = self.data.get(self.pos..self.pos + 8) {
            let word = u64::from_be_bytes(chunk.try_into().unwrap_or([0xFF; 8]));
            let inverted = !word;
            let has_ff = inverted.wrapping_sub(0x0101_0101_0101_0101) & !inverted;
            if has_ff & 0x8080_8080_8080_8080 == 0 {
                self.acc |= word >> self.count;
                let bytes = (63 - self.count) >> 3;
                self.pos += bytes as usize;
                self.count += bytes * 8;
                return;
            }
        }
        while self.count <= 56 {
            self.refill_byte();
        }
    }

    #[inline(always)]
    fn refill_byte(&mut self) {
        let byte = match self.data.get(self.pos) {
            Some(&0xFF) if self.data.get(self.pos + 1) == Some(&0) => {
                self.pos += 2;
                0xFF
            }
            Some(&b) if b != 0xFF => {
                self.pos += 1;
                b
            }
            // A marker, or the end: zeros, counted.
            _ => {
                self.fed_bits += 8;
                0
            }
        };
        self.acc |= u64::from(byte) << (56 - self.count);
        self.count += 8;
    }

    #[inline(always)]
    fn peek(&self, bits: u32) -> u32 {
        (self.acc >> (64 - bits)) as u32
    }

    #[inline(always)]
    fn consume(&mut self, bits: u32) {
        self.acc <<= bits;
        self.count -= bits;
    }

    /// One symbol of `table`.
    #[inline(always)]
    fn symbol(&mut self, table: &Table) -> Result<u8, String> {
        let entry = table.fast[self.peek(FAST_BITS) as usize];
        if entry != 0 {
            self.consume(u32::from(entry >> 8));
            return Ok(entry as u8);
        }
        self.symbol_long(table)
    }

    #[cold]
    fn symbol_long(&mut self, table: &Table) -> Result<u8, String> {
        let bits = self.peek(16) as i32;
        for len in FAST_BITS as usize + 1..=16 {
            let code = bits >> (16 - len);
            if code <= table.max_code[len] {
                self.consume(len as u32);
                let at = (code + table.offset[len]) as usize & 0xFF;
                return Ok(table.symbols[at]);
            }
        }
        Err(format!(
            "a Huffman code not in its table (before byte {})",
            self.pos
        ))
    }

    /// `size` bits as a signed value (size <= 16).
    #[inline(always)]
    fn value(&mut self, size: u32) -> i32 {
        if size == 0 {
            return 0;
        }
        let bits = self.peek(size);
        self.consume(size);
        extend(bits, size)
    }

    /// Decodes one block's coefficients, dequantized by `quant` (zigzag order), into
    /// `coefs` (natural order, all zero on entry); `dc` is the component's predictor.
    /// Returns the zigzag index past the last coefficient written (1 = DC alone).
    #[inline(always)]
    pub(super) fn block(
        &mut self,
        dc_table: &Table,
        ac_table: &Table,
        quant: &[i32; 64],
        dc: &mut i32,
        coefs: &mut [i32; 80],
    ) -> Result<usize, String> {
        self.dc(dc_table, dc)?;
        coefs[0] = dc.wrapping_mul(quant[0]);
        let mut k = 1usize;
        let mut last = 1usize;
        while k < 64 {
            if self.count < 32 {
                self.refill();
            }
            let fast = ac_table.ac[self.peek(FAST_BITS) as usize];
            if fast != 0 {
                self.consume((fast & 0xFF) as u32);
                let mut value = fast >> 16;
                if fast & (END_OF_BLOCK | VALUE_AFTER) != 0 {
                    if fast & END_OF_BLOCK != 0 {
                        break;
                    }
                    value = self.value(value as u32);
                }
                k += ((fast & RUN) >> 8) as usize;
                let at = ZIGZAG[k.min(79)] as usize;
                coefs[at] = value.wrapping_mul(quant[k & 63]);
                k += 1;
                last = k;
                continue;
            }
            let symbol = self.symbol(ac_table)?;
            let (run, size) = (usize::from(symbol >> 4), u32::from(symbol & 15));
            if size == 0 {
                if run == 15 {
                    k += 16;
                    continue;
                }
                break;
            }
            k += run;
            let value = self.value(size);
            let at = ZIGZAG[k.min(79)] as usize;
            coefs[at] = value.wrapping_mul(quant[k & 63]);
            k += 1;
            last = k;
        }
        self.block_end(k)?;
        Ok(last)
    }

    /// Decodes one block and drops it, keeping only the DC predictor.
    #[inline(always)]
    pub(super) fn skip_block(
        &mut self,
        dc_table: &Table,
        ac_table: &Table,
        dc: &mut i32,
    ) -> Result<(), String> {
        self.dc(dc_table, dc)?;
        let mut k = 1usize;
        while k < 64 {
            if self.count < 32 {
                self.refill();
            }
            let fast = ac_table.ac[self.peek(FAST_BITS) as usize];
            if fast != 0 {
                self.consume((fast & 0xFF) as u32);
                if fast & (END_OF_BLOCK | VALUE_AFTER) != 0 {
                    if fast & END_OF_BLOCK != 0 {
                        break;
                    }
                    self.consume((fast >> 16) as u32);
                }
                k += ((fast & RUN) >> 8) as usize + 1;
                continue;
            }
            let symbol = self.symbol(ac_table)?;
            let (run, size) = (usize::from(symbol >> 4), u32::from(symbol & 15));
            if size == 0 {
                if run == 15 {
                    k += 16;
                    continue;
                }
                break;
            }
            self.consume(size);
            k += run + 1;
        }
        self.block_end(k)
    }

    /// A block's DC difference, added to the component's predictor `dc`.
    #[inline(always)]
    fn dc(&mut self, dc_table: &Table, dc: &mut i32) -> Result<(), String> {
        if self.count < 32 {
            self.refill();
        }
        // A DC symbol is its difference's size, so the AC lookup reads code and value at once
        // where both fit: size 0 is the entry flagged as an end of block, whose value is 0.
        let fast = dc_table.ac[self.peek(FAST_BITS) as usize];
        let diff = if fast != 0 && fast & (RUN | VALUE_AFTER) == 0 {
            self.consume((fast & 0xFF) as u32);
            fast >> 16
        } else {
            let size = u32::from(self.symbol(dc_table)?);
            if size > 11 {
                return Err(format!(
                    "a DC difference of {size} bits (before byte {})",
                    self.pos
                ));
            }
            self.value(size)
        };
        // A corrupt DC may grow without bound: kept within what 16 bits hold, as libjpeg's.
        *dc = i32::from(dc.wrapping_add(diff) as i16);
        Ok(())
    }

    /// Refuses a block whose runs went past its 64 coefficients (`k`, the index reached).
    #[inline(always)]
    fn block_end(&self, k: usize) -> Result<(), String> {
        if k > 64 {
            return Err(format!(
                "a block of more than 64 coefficients (before byte {})",
                self.pos
            ));
        }
        Ok(())
    }

    /// At a restart boundary: drops the bits left, finds the marker RSTn expected next
    /// (after any fill bytes), and reads on after it.
    pub(super) fn restart(&mut self, expected: u8) -> Result<(), String> {
        self.acc = 0;
        self.count = 0;
        self.fed_bits = 0;
        self.pos = next_marker(self.data, self.pos)
            .ok_or_else(|| format!("no RST{expected} marker after byte {}", self.pos))?;
        let marker = self.data[self.pos + 1];
        if marker != 0xD0 + expected {
            return Err(format!(
                "marker {marker:02X} at byte {} where RST{expected} was expected",
                self.pos
            ));
        }
        self.pos += 2;
        Ok(())
    }
}

/// The offset of the next marker (0xFF then neither 0x00 nor 0xFF) from `pos` on, its
/// 0xFF's.
pub(super) fn next_marker(data: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        let at = pos + data.get(pos..)?.iter().position(|&b| b == 0xFF)?;
        match *data.get(at + 1)? {
            0x00 => pos = at + 2,
            0xFF => pos = at + 1,
            _ => return Some(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The symbols `bits` (a byte string, no 0xFF) decode to under `table`.
    fn symbols(table: &Table, bytes: &[u8], n: usize) -> Vec<u8> {
        let mut bits = Bits::new(bytes, 0);
        (0..n)
            .map(|_| {
                bits.refill();
                bits.symbol(table).unwrap()
            })
            .collect()
    }

    /// Canonical codes of a table's symbols: (code, length) by symbol.
    fn codes(counts: &[u8; 16], symbols: &[u8]) -> Vec<(u8, u32, u32)> {
        let (mut code, mut k, mut out) = (0u32, 0usize, Vec::new());
        for (i, &n) in counts.iter().enumerate() {
            for _ in 0..n {
                out.push((symbols[k], code, i as u32 + 1));
                code += 1;
                k += 1;
            }
            code <<= 1;
        }
        out
    }

    /// Bits written most significant first.
    #[derive(Default)]
    struct Writer {
        bytes: Vec<u8>,
        acc: u64,
        count: u32,
    }

    impl Writer {
        fn put(&mut self, bits: u32, len: u32) {
            self.acc = self.acc << len | u64::from(bits) & ((1 << len) - 1);
            self.count += len;
            while self.count >= 8 {
                self.count -= 8;
                self.bytes.push((self.acc >> self.count) as u8);
            }
        }

        fn symbol(&mut self, table: &[(u8, u32, u32)], symbol: u8, value: i32) {
            let &(_, code, len) = table.iter().find(|e| e.0 == symbol).unwrap();
            self.put(code, len);
            let size = u32::from(symbol & 15);
            if size > 0 {
                let bits = if value > 0 {
                    value
                } else {
                    value + (1 << size) - 1
                };
                self.put(bits as u32, size);
            }
        }
    }

    #[test]
    fn a_block_decodes_every_kind_of_lookup_entry_alike_whether_kept_or_skipped() {
        // DC: sizes 0, 1, 2 in 2 bits. AC: the end of block and size 1 in 2 bits (in the
        // lookup with their values), size 10 and a run of 16 zeros in 3 (the first's value
        // past the lookup), run 1 of size 3 in 4, and size 5 as a 12-bit code (past it).
        let mut dc_counts = [0u8; 16];
        dc_counts[1] = 3;
        let dc_symbols = [0u8, 1, 2];
        let mut ac_counts = [0u8; 16];
        (ac_counts[1], ac_counts[2], ac_counts[3], ac_counts[11]) = (2, 2, 1, 1);
        let ac_symbols = [0x00u8, 0x01, 0x0A, 0xF0, 0x13, 0x05];
        let (mut dc_table, mut ac_table) = (Table::default(), Table::default());
        dc_table.build(&dc_counts, &dc_symbols).unwrap();
        ac_table.build(&ac_counts, &ac_symbols).unwrap();
        let (dc_codes, ac_codes) = (
            codes(&dc_counts, &dc_symbols),
            codes(&ac_counts, &ac_symbols),
        );
        let mut w = Writer::default();
        for _ in 0..2 {
            w.symbol(&dc_codes, 2, -3);
            for (symbol, value) in [(0x01, 1), (0x0A, -700), (0xF0, 0), (0x13, 5), (0x05, 17)] {
                w.symbol(&ac_codes, symbol, value);
            }
            w.symbol(&ac_codes, 0x00, 0);
        }
        // A third block: no DC difference (the lookup's entry flagged as an end of block),
        // then the end of block.
        w.symbol(&dc_codes, 0, 0);
        w.symbol(&ac_codes, 0x00, 0);
        w.put(u32::MAX, 7);
        w.bytes.extend_from_slice(&[0; 16]);

        let quant = [2i32; 64];
        let mut bits = Bits::new(&w.bytes, 0);
        let (mut dc, mut coefs) = (10, [0i32; 80]);
        let last = bits
            .block(&dc_table, &ac_table, &quant, &mut dc, &mut coefs)
            .unwrap();
        let mut expected = [0i32; 80];
        expected[0] = 14;
        for (k, value) in [(1, 2), (2, -1400), (20, 10), (21, 34)] {
            expected[usize::from(ZIGZAG[k])] = value;
        }
        assert_eq!((dc, last), (7, 22));
        assert_eq!(coefs[..64], expected[..64]);
        // The second block, skipped, leaves the reader where decoding it would have.
        bits.skip_block(&dc_table, &ac_table, &mut dc).unwrap();
        assert_eq!(dc, 4);
        let mut again = Bits::new(&w.bytes, 0);
        let mut dc2 = 10;
        let mut scratch = [0i32; 80];
        for _ in 0..2 {
            scratch = [0; 80];
            again
                .block(&dc_table, &ac_table, &quant, &mut dc2, &mut scratch)
                .unwrap();
        }
        expected[0] = 8;
        assert_eq!((dc2, scratch[..64].to_vec()), (4, expected[..64].to_vec()));
        assert_eq!(
            (bits.position(), bits.count),
            (again.position(), again.count)
        );
        let mut third = [0i32; 80];
        let last = bits
            .block(&dc_table, &ac_table, &quant, &mut dc, &mut third)
            .unwrap();
        assert_eq!((dc, last, third[0]), (4, 1, 8));
        assert!(third[1..64].iter().all(|&c| c == 0));
    }

    #[test]
    fn a_table_defined_again_decodes_by_its_own_codes_whether_rebuilt_or_reused() {
        // Two codes of 1 bit: 0 and 1.
        let mut counts = [0u8; 16];
        counts[0] = 2;
        let (a, b) = ([7u8, 9], [9u8, 7]);
        let mut table = Table::default();
        // 0b0110_0000: codes 0, 1, 1, 0.
        let bytes = [0b0110_0000, 0, 0, 0, 0, 0, 0, 0, 0];
        table.build(&counts, &a).unwrap();
        assert_eq!(symbols(&table, &bytes, 4), [7, 9, 9, 7]);
        table.build(&counts, &b).unwrap();
        assert_eq!(symbols(&table, &bytes, 4), [9, 7, 7, 9]);
        table.defined = false;
        table.build(&counts, &b).unwrap();
        assert!(table.defined);
        assert_eq!(symbols(&table, &bytes, 4), [9, 7, 7, 9]);
        // A failed build is not reused: the same bytes as before it are built again.
        let mut overfull = [0u8; 16];
        overfull[0] = 3;
        assert!(table.build(&overfull, &[1, 2, 3]).is_err());
        table.build(&counts, &b).unwrap();
        assert_eq!(symbols(&table, &bytes, 4), [9, 7, 7, 9]);
        // Longer codes than the lookup's: one of 1 bit, two of 12 bits.
        let mut long = [0u8; 16];
        long[0] = 1;
        long[11] = 2;
        table.build(&long, &[1, 2, 3]).unwrap();
        // 0, then 1000_0000_0000 (the first 12-bit code, 2), then 1000_0000_0001 (3).
        let bytes = [
            0b0100_0000,
            0b0000_0100,
            0b0000_0000,
            0b1000_0000,
            0,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(symbols(&table, &bytes, 3), [1, 2, 3]);
    }
}
