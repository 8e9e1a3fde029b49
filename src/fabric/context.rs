//! Operation contexts. Providers that require FI_CONTEXT / FI_CONTEXT2 (efa-direct) own the first
//! bytes of every operation's context until its completion, so each posted operation gets one from a
//! fixed pool; the completion hands it back. The `tag` says what the completion means to the caller.
//!
//! Each hand-out of a context has a *token* ([`OpContexts::token`]): its slot and a generation that
//! changes at every hand-out and every free. A token therefore names one use of a context, not its
//! memory: a message that echoes a token (an answer to a request) and arrives after the context was
//! freed, or freed and taken again, finds no context ([`OpContexts::by_token`]), and
//! [`OpContexts::free_token`] frees a context at most once however many parties try.
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

/// One operation context: 64 bytes for the provider (`struct fi_context2`), then the caller's data.
#[repr(C)]
pub struct OpContext {
    provider: [usize; 8],
    /// What the completion means to the caller.
    pub tag: u64,
    /// Caller data (e.g. an index or a pointer).
    pub data: u64,
    /// Scratch space that lives as long as the operation (operands, small messages).
    pub scratch: [u64; 8],
    slot: u32,
    /// Odd while handed out, even while free; advanced (under the free list's lock) by every
    /// alloc and every free.
    gen: AtomicU32,
}

/// A fixed pool of contexts.
pub struct OpContexts {
    slots: Box<[UnsafeCell<OpContext>]>,
    free: Mutex<Vec<u32>>,
}

// SAFETY: a context is handed to exactly one user between alloc and free; the free list is locked.
unsafe impl Send for OpContexts {}
// SAFETY: as above.
unsafe impl Sync for OpContexts {}

impl OpContexts {
    /// A pool of `n` contexts.
    pub fn new(n: usize) -> OpContexts {
        let slots: Vec<UnsafeCell<OpContext>> = (0..n)
            .map(|i| {
                UnsafeCell::new(OpContext {
                    provider: [0; 8],
                    tag: 0,
                    data: 0,
                    scratch: [0; 8],
                    slot: i as u32,
                    gen: AtomicU32::new(0),
                })
            })
            .collect();
        OpContexts {
            slots: slots.into_boxed_slice(),
            free: Mutex::new((0..n as u32).rev().collect()),
        }
    }

    /// Takes a context, or `None` when all are in flight (reap completions, then retry).
    pub fn alloc(&self, tag: u64, data: u64) -> Option<*mut c_void> {
        let mut free = self.free.lock();
        let slot = free.pop()?;
        let p = self.slots[slot as usize].get();
        // SAFETY: the slot was free, so nobody else refers to it. The tag is written under the
        // free list's lock (see `in_flight_by_tag`).
        unsafe {
            (*p).provider = [0; 8];
            (*p).tag = tag;
            (*p).data = data;
            (*p).scratch = [0; 8];
            (*p).gen.fetch_add(1, Ordering::AcqRel);
        }
        drop(free);
        Some(p as *mut c_void)
    }

    /// The token of a handed-out context: its slot (low 32 bits) and its current generation (high
    /// 32 bits); `None` for a foreign pointer or a context that is free.
    pub fn token(&self, ctx: *mut c_void) -> Option<u64> {
        let slot = self.slot_of(ctx)?;
        let gen = self.gen_of(slot);
        (gen & 1 == 1).then_some(u64::from(gen) << 32 | slot as u64)
    }

    /// The context a token names, while that hand-out lasts; `None` once it was freed (whether or
    /// not the slot was taken again since) or for a token this pool never made.
    pub fn by_token(&self, token: u64) -> Option<*mut c_void> {
        let (slot, gen) = ((token & 0xffff_ffff) as usize, (token >> 32) as u32);
        if slot >= self.slots.len() || gen & 1 == 0 || self.gen_of(slot) != gen {
            return None;
        }
        Some(self.slots[slot].get() as *mut c_void)
    }

    /// Frees the context a token names if that hand-out still lasts; false (nothing done) when it
    /// was freed already.
    pub fn free_token(&self, token: u64) -> bool {
        let (slot, gen) = ((token & 0xffff_ffff) as usize, (token >> 32) as u32);
        if slot >= self.slots.len() || gen & 1 == 0 {
            return false;
        }
        let mut free = self.free.lock();
        if self.gen_of(slot) != gen {
            return false;
        }
        // SAFETY: slot < len (checked above); the generation is atomic.
        unsafe { (*self.slots[slot].get()).gen.fetch_add(1, Ordering::AcqRel) };
        free.push(slot as u32);
        true
    }

    fn gen_of(&self, slot: usize) -> u32 {
        // SAFETY: slot < len (callers check); the generation is atomic and read without the lock.
        unsafe { (*self.slots[slot].get()).gen.load(Ordering::Acquire) }
    }

    /// Reads the tag and data of a context this pool handed out, or `None` for a foreign pointer.
    pub fn get(&self, ctx: *mut c_void) -> Option<(u64, u64)> {
        let slot = self.slot_of(ctx)?;
        // SAFETY: slot_of checked that ctx is one of our slots.
        let c = unsafe { &*self.slots[slot].get() };
        Some((c.tag, c.data))
    }

    /// Pointer to the scratch space of a context this pool handed out.
    pub fn scratch(&self, ctx: *mut c_void) -> Option<*mut u64> {
        let slot = self.slot_of(ctx)?;
        // SAFETY: slot_of checked that ctx is one of our slots; the field address is in bounds.
        Some(unsafe { (*self.slots[slot].get()).scratch.as_mut_ptr() })
    }

    /// The whole slab `(address, bytes)`, so that it can be registered once for FI_MR_LOCAL providers.
    pub fn region(&self) -> (*const u8, usize) {
        (
            self.slots.as_ptr() as *const u8,
            std::mem::size_of_val(&*self.slots),
        )
    }

    /// Returns a context to the pool. Foreign or null pointers, and a context that is free
    /// already (a second free), are ignored (returns false).
    pub fn free(&self, ctx: *mut c_void) -> bool {
        let Some(slot) = self.slot_of(ctx) else {
            return false;
        };
        let mut free = self.free.lock();
        // SAFETY: slot_of checked the pointer; the generation is atomic.
        let gen = unsafe { &(*self.slots[slot].get()).gen };
        if gen.load(Ordering::Acquire) & 1 == 0 {
            return false;
        }
        gen.fetch_add(1, Ordering::AcqRel);
        free.push(slot as u32);
        true
    }

    /// Contexts currently handed out.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.lock().len()
    }

    /// Contexts currently handed out, counted by tag (ascending), for diagnostics: a snapshot.
    pub fn in_flight_by_tag(&self) -> Vec<(u64, usize)> {
        let free = self.free.lock();
        let mut is_free = vec![false; self.slots.len()];
        for &f in free.iter() {
            is_free[f as usize] = true;
        }
        let mut by: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if !is_free[i] {
                // SAFETY: reading a handed-out slot's tag; it is written only at alloc, under the
                // free list's lock, which is held here.
                *by.entry(unsafe { (*slot.get()).tag }).or_default() += 1;
            }
        }
        by.into_iter().collect()
    }

    fn slot_of(&self, ctx: *mut c_void) -> Option<usize> {
        if ctx.is_null() || self.slots.is_empty() {
            return None;
        }
        let base = self.slots.as_ptr() as usize;
        let size = std::mem::size_of::<UnsafeCell<OpContext>>();
        let off = (ctx as usize).checked_sub(base)?;
        if off % size != 0 || off / size >= self.slots.len() {
            return None;
        }
        Some(off / size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_roundtrip_and_foreign_pointers() {
        let pool = OpContexts::new(3);
        let a = pool.alloc(1, 10).unwrap();
        let b = pool.alloc(2, 20).unwrap();
        let c = pool.alloc(3, 30).unwrap();
        assert!(pool.alloc(4, 40).is_none());
        assert_eq!(pool.get(b), Some((2, 20)));
        assert_eq!(pool.in_flight(), 3);
        assert!(pool.free(b));
        assert!(!pool.free(std::ptr::null_mut()));
        let mut x = 0u64;
        assert!(!pool.free(&mut x as *mut u64 as *mut c_void));
        assert_eq!(pool.get((a as usize + 1) as *mut c_void), None);
        let d = pool.alloc(5, 50).unwrap();
        assert_eq!(d, b);
        assert_eq!(pool.get(d), Some((5, 50)));
        assert!(pool.free(a) && pool.free(c) && pool.free(d));
        assert_eq!(pool.in_flight(), 0);
        // A second free is refused: the slot is not handed out twice.
        assert!(!pool.free(a));
        assert_eq!(pool.in_flight(), 0);
        assert_eq!(pool.free.lock().len(), 3);
    }

    #[test]
    fn a_token_names_one_hand_out_of_a_context() {
        let pool = OpContexts::new(1);
        let a = pool.alloc(1, 10).unwrap();
        let ta = pool.token(a).unwrap();
        assert_eq!(pool.by_token(ta), Some(a));
        assert!(pool.free(a));
        // Freed: the token names nothing, and a free through it does nothing.
        assert_eq!(pool.token(a), None);
        assert_eq!(pool.by_token(ta), None);
        assert!(!pool.free_token(ta));
        // The same memory handed out again has another token; the old one still names nothing.
        let b = pool.alloc(2, 20).unwrap();
        assert_eq!(b, a);
        let tb = pool.token(b).unwrap();
        assert_ne!(ta, tb);
        assert_eq!(pool.by_token(ta), None);
        assert!(!pool.free_token(ta));
        assert_eq!(pool.get(b), Some((2, 20)));
        // Freed once through its token, whoever tries next.
        assert!(pool.free_token(tb));
        assert!(!pool.free_token(tb));
        assert!(!pool.free(b));
        assert_eq!(pool.in_flight(), 0);
        // Tokens this pool never made.
        assert_eq!(pool.by_token(u64::MAX), None);
        assert_eq!(pool.by_token(tb & 0xffff_ffff), None);
        assert!(!pool.free_token(7 << 32 | 5));
    }
}
