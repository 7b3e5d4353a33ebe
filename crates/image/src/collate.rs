//! A batch of equally sized images in one contiguous `[B, H, W, 3]` buffer, and its labels
//! in `[B]`: allocated once and reused batch after batch, so a consumer (a tensor library)
//! can wrap it without copying.

use crate::error::ImageError;

/// Collates up to `batch` images of `height` x `width` RGB.
#[derive(Debug)]
pub struct Collator {
    images: Vec<u8>,
    labels: Vec<u32>,
    capacity: usize,
    image_bytes: usize,
    shape: (usize, usize),
}

impl Collator {
    pub fn new(batch: usize, height: u32, width: u32) -> Self {
        let image_bytes = height as usize * width as usize * 3;
        Collator {
            images: Vec::with_capacity(batch * image_bytes),
            labels: Vec::with_capacity(batch),
            capacity: batch,
            image_bytes,
            shape: (height as usize, width as usize),
        }
    }

    /// Starts the next batch in the same memory.
    pub fn clear(&mut self) {
        self.images.clear();
        self.labels.clear();
    }

    /// Appends one image's pixels and its label.
    ///
    /// # Errors
    /// Pixels of another size than the batch's images, or a full batch.
    pub fn push(&mut self, pixels: &[u8], label: u32) -> Result<(), ImageError> {
        if pixels.len() != self.image_bytes {
            return Err(ImageError::Buffer {
                expected: self.image_bytes,
                actual: pixels.len(),
            });
        }
        if self.labels.len() == self.capacity {
            return Err(ImageError::BatchFull {
                capacity: self.capacity,
            });
        }
        self.images.extend_from_slice(pixels);
        self.labels.push(label);
        Ok(())
    }

    /// The images so far, `[len, height, width, 3]`.
    pub fn images(&self) -> &[u8] {
        &self.images
    }

    /// The images so far, writable in place (a consumer's batch is its own until returned).
    pub fn images_mut(&mut self) -> &mut [u8] {
        &mut self.images
    }

    /// The labels so far, `[len]`.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// Images a batch holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Images collated so far.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// `[len, height, width, 3]`.
    pub fn shape(&self) -> [usize; 4] {
        [self.len(), self.shape.0, self.shape.1, 3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_reuse_one_buffer_and_refuse_what_does_not_fit() {
        let mut c = Collator::new(2, 1, 2);
        let base = c.images().as_ptr();
        c.push(&[1; 6], 3).unwrap();
        c.push(&[2; 6], 4).unwrap();
        assert_eq!(c.shape(), [2, 1, 2, 3]);
        assert_eq!(c.images(), &[1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert_eq!(
            c.push(&[3; 6], 5),
            Err(ImageError::BatchFull { capacity: 2 })
        );
        c.clear();
        c.push(&[9; 6], 1).unwrap();
        assert_eq!(
            c.images().as_ptr(),
            base,
            "the same memory, batch after batch"
        );
        assert_eq!(
            c.push(&[9; 5], 1),
            Err(ImageError::Buffer {
                expected: 6,
                actual: 5
            })
        );
    }
}
