//! Cache-line write-back, fences and non-temporal copies (x86-64; portable fallbacks
//! elsewhere so the crate still builds).

use crate::CACHE_LINE;

/// The write-back instruction used in `CacheLine` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushInstr {
    /// Write back, keep the line cached (best).
    Clwb,
    /// Write back and evict, weakly ordered.
    Clflushopt,
    /// Write back and evict, strongly ordered (oldest, slowest).
    Clflush,
}

impl FlushInstr {
    /// The best instruction this CPU has, by CPUID (asked once: CPUID traps in a VM).
    pub fn detect() -> FlushInstr {
        static DETECTED: std::sync::OnceLock<FlushInstr> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(Self::cpuid)
    }

    fn cpuid() -> FlushInstr {
        #[cfg(target_arch = "x86_64")]
        {
            let max = core::arch::x86_64::__cpuid(0).eax;
            if max >= 7 {
                // Leaf 7 is supported (checked against the max leaf above).
                let ebx = core::arch::x86_64::__cpuid_count(7, 0).ebx;
                if ebx & (1 << 24) != 0 {
                    return FlushInstr::Clwb;
                }
                if ebx & (1 << 23) != 0 {
                    return FlushInstr::Clflushopt;
                }
            }
        }
        FlushInstr::Clflush
    }

    pub fn available(self) -> bool {
        matches!(
            (FlushInstr::detect(), self),
            (_, FlushInstr::Clflush)
                | (FlushInstr::Clwb, _)
                | (FlushInstr::Clflushopt, FlushInstr::Clflushopt)
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            FlushInstr::Clwb => "clwb",
            FlushInstr::Clflushopt => "clflushopt",
            FlushInstr::Clflush => "clflush",
        }
    }
}

/// Write back every cache line of `[p, p+len)`.
///
/// # Safety
/// The range must be mapped.
pub(crate) unsafe fn flush_range(instr: FlushInstr, p: *const u8, len: usize) {
    let start = (p as usize) & !(CACHE_LINE - 1);
    let end = p as usize + len;
    let mut a = start;
    while a < end {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `a` lies in a mapped cache line of the range (caller's contract); the
        // instruction is available (chosen by CPUID or checked by `available`).
        unsafe {
            match instr {
                FlushInstr::Clwb => core::arch::asm!("clwb [{}]", in(reg) a, options(nostack)),
                FlushInstr::Clflushopt => {
                    core::arch::asm!("clflushopt [{}]", in(reg) a, options(nostack))
                }
                FlushInstr::Clflush => core::arch::x86_64::_mm_clflush(a as *const u8),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = instr;
        a += CACHE_LINE;
    }
}

pub(crate) fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no memory operands; SSE is baseline on x86-64.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copy with non-temporal stores for the 16-byte-aligned middle and ordinary stores plus
/// write-back for the unaligned edges. Durable after the next `sfence`.
///
/// # Safety
/// `dst..dst+src.len()` must be mapped and not used by anyone else meanwhile.
pub(crate) unsafe fn copy_nontemporal(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let len = src.len();
        let head = ((16 - (dst as usize) % 16) % 16).min(len);
        // SAFETY: all pointers below stay within `dst..dst+len` and `src`, by construction.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            flush_range(FlushInstr::detect(), dst, head);
            let mut i = head;
            while i + 16 <= len {
                let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
                i += 16;
            }
            let tail = len - i;
            std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), tail);
            flush_range(FlushInstr::detect(), dst.add(i), tail);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
}
