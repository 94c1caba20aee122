// Preloaded into the service by bench/stream.ts only (with --expose-gc):
// SIGWINCH (ignored by default, and not one of close-with-grace's shutdown
// signals) runs a full garbage collection, so that resident memory read
// right after reflects live objects rather than garbage not yet collected.
process.on('SIGWINCH', () => { (globalThis as { gc?: () => void }).gc?.() })
