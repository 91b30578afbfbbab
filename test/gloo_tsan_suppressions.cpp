// SPDX-License-Identifier: Apache-2.0
// ThreadSanitizer's suppressions for the programs that run Gloo (linked into
// them; TSan reads __tsan_default_suppressions at start-up, so the rank
// processes a test starts get them too).
//
// libgloo (Debian's 0.0~git20220518.5b14351): when gloo::allreduce fails (a timeout,
// a peer killed mid-transfer: test_comm_gloo's kill test), it destroys its
// own temporary UnboundBuffer while unwinding, and the pair's event-loop
// thread can still be in UnboundBuffer::handleRecvCompletion for it,
// signalling the buffer's condition variable (TSan reported it once in
// test_comm_gloo's kill test, which passed when rerun: a write in
// ~UnboundBuffer, from inside gloo::allreduce, against pthread_cond_signal
// and a mutex lock in handleRecvCompletion on the loop thread). The buffer is internal to
// gloo::allreduce, destroyed before the exception reaches comm::gloo, which
// closes the connections as soon as it catches it (closing_on_failure);
// nothing of ours touches it. Only races with handleRecvCompletion on one
// side are suppressed.

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DILOCO_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define DILOCO_TSAN 1
#endif

#if defined(DILOCO_TSAN)
extern "C" const char* __tsan_default_suppressions();
extern "C" const char* __tsan_default_suppressions() {
  return "race:gloo::transport::tcp::UnboundBuffer::handleRecvCompletion\n";
}
#endif
