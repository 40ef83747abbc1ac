"""The farm for tests and for `torchfarm up`: the embedded local stack of real processes
(`stack`), and in-process fakes behind the same interfaces (`fakes`)."""
