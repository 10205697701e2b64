// Arithmetic and comparisons shared by the two 16-bit float stubs (cuda_fp16.h, cuda_bf16.h).
//
// Each operation is done in float and rounded once to the 16-bit type.  float carries more than twice the
// significand bits of binary16 (11) and bfloat16 (8) plus two, so that double rounding equals the single
// correctly rounded result that the hardware's half/bf16 instructions give, for + - * /.
#pragma once

#define EMU_HALF_OPERATORS(H)                                                                           \
  inline H operator+(H a, H b) { return H((float)a + (float)b); }                                        \
  inline H operator-(H a, H b) { return H((float)a - (float)b); }                                        \
  inline H operator*(H a, H b) { return H((float)a * (float)b); }                                        \
  inline H operator/(H a, H b) { return H((float)a / (float)b); }                                        \
  inline H operator-(H a) { H r; r.__x = (unsigned short)(a.__x ^ 0x8000u); return r; }               \
  inline H operator+(H a) { return a; }                                                                  \
  inline H& operator+=(H& a, H b) { return a = a + b; }                                                  \
  inline H& operator-=(H& a, H b) { return a = a - b; }                                                  \
  inline H& operator*=(H& a, H b) { return a = a * b; }                                                  \
  inline H& operator/=(H& a, H b) { return a = a / b; }                                                  \
  inline bool operator==(H a, H b) { return (float)a == (float)b; }                                      \
  inline bool operator!=(H a, H b) { return (float)a != (float)b; }                                      \
  inline bool operator<(H a, H b) { return (float)a < (float)b; }                                        \
  inline bool operator>(H a, H b) { return (float)a > (float)b; }                                        \
  inline bool operator<=(H a, H b) { return (float)a <= (float)b; }                                      \
  inline bool operator>=(H a, H b) { return (float)a >= (float)b; }
