// SPDX-License-Identifier: Apache-2.0
// The translation unit that builds the test programs' shared precompiled
// header (test/CMakeLists.txt, diloco_test_pch); it has no code of its own.
