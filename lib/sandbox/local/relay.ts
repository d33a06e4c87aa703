/**
 * The relay of sandbox mode local: a small Perl program, started as a command in the sandbox like
 * any other (the same confinement as the agent's), that listens on the session's loopback ports
 * and carries each connection to its proxy's Unix socket in the bound socket directory — the
 * socket path of relay/main.ts, the only one a local sandbox uses (docs/local.md).
 *
 * Why not relay/main.ts: a Deno program takes ~30 ms of a sandbox's start before it listens; Perl,
 * loading no module, ~1 ms. It holds no secret and decides nothing (the proxies on the host check
 * every request), and speaks only the first word of the mux: READY `sandbox-relay/1 socket`
 * (lib/proxy/mux.ts), after which its stdio keeps only its lifetime. When its stdin ends (the host
 * went away, or closed it) it exits, which closes every connection it carried.
 *
 * Arguments, as relay_host.ts gives them: `[--wait] --sockets DIR SERVICE=PORT...`. Exit codes as
 * relay/main.ts's: 0 its stdin ended; 1 a proxy socket does not answer, or a failure; 2 usage; 75
 * a port cannot be listened on (with `--wait`, one in use is retried for 2 s first).
 *
 * One process, one `select` loop, non-blocking sockets: each direction of a connection holds at
 * most `CAP` bytes on their way (a slow reader stalls only its own connection), a half-close is
 * passed on once what came before it is written, and a failure on either side ends both. With no
 * descriptor left it accepts nothing for a second, or until a connection ends, instead of spinning
 * on a listener it cannot accept from; a connection accepted with no descriptor left for its proxy's
 * socket waits for one. It loads
 * no module, so `PERL5LIB`/`PERL5OPT` would change nothing (and the sandbox's environment has
 * neither); the socket constants are Linux's, the same on x86_64 and aarch64.
 */

import { PERL } from "./bwrap.ts";

const PROGRAM = `
$SIG{PIPE} = "IGNORE";
my ($EINTR, $EAGAIN, $ENFILE, $EMFILE, $EADDRINUSE) = (4, 11, 23, 24, 98);
my ($CAP, $CHUNK) = (1 << 20, 256 * 1024);
sub fail { syswrite(STDERR, "sandbox relay: $_[0]\\n"); exit $_[1] }
sub nonblock { fcntl($_[0], 4, (fcntl($_[0], 3, 0) + 0) | 0x800) }
sub unix_conn {
  socket(my $s, 1, 1, 0) or return;
  connect($s, pack("S a108", 1, $_[0])) or return;
  return $s;
}
my ($wait, $dir, @services) = (0);
while (@ARGV) {
  my $arg = shift @ARGV;
  if ($arg eq "--wait") { $wait = 1 }
  elsif ($arg eq "--sockets") {
    $dir = shift @ARGV;
    fail("invalid socket directory", 2) unless defined $dir && $dir =~ m{^/[A-Za-z0-9._/-]{1,200}$};
  } elsif ($arg =~ /^([a-z]{1,16})=(\\d{1,5})$/ && $2 > 0 && $2 < 65536) { push @services, [$1, $2] }
  else { fail("unexpected argument \\"$arg\\" (usage: [--wait] --sockets DIR SERVICE=PORT...)", 2) }
}
fail("--sockets DIR and a SERVICE=PORT are needed", 2) unless defined $dir && @services;
for (@services) {
  my $s = unix_conn("$dir/$_->[0].sock") or fail("$dir/$_->[0].sock does not answer: $!", 1);
  close $s;
}
my %listener;
for (@services) {
  my ($service, $port) = @$_;
  socket(my $l, 2, 1, 0) or fail("socket: $!", 1);
  setsockopt($l, 1, 2, pack("i", 1));
  my $tries = $wait ? 40 : 0;
  until (bind($l, pack("S n C4 x8", 2, $port, 127, 0, 0, 1))) {
    fail("cannot listen on 127.0.0.1:$port: $!", 75) if $! + 0 != $EADDRINUSE || $tries-- <= 0;
    select(undef, undef, undef, 0.05);
  }
  listen($l, 128) or fail("cannot listen on 127.0.0.1:$port: $!", 75);
  nonblock($l);
  $listener{fileno $l} = [$l, "$dir/$service.sock"];
}
my $ready = "sandbox-relay/1 socket";
syswrite(STDOUT, pack("C N N", 1, 0, length $ready) . $ready);

# Each end of a carried connection: its socket, the other end, the bytes on their way to it, whether
# its reads have ended, whether its writes have been shut.
my %end;
# When the descriptors ran out, the time (whole seconds) until which no connection is accepted: a
# listener with a connection waiting stays readable, and accepting again at once would spin. A
# connection that ends gives descriptors back and ends the pause.
my $paused = 0;
# Whether the call that just failed lacked a descriptor; if so the pause begins.
sub out_of_descriptors {
  return 0 unless $! + 0 == $EMFILE || $! + 0 == $ENFILE;
  $paused = time + 1;
}
sub drop {
  my $e = shift;
  for my $x ($e, $e->{peer}) { close $x->{fh}; delete $end{$x->{fd}} }
  delete $e->{peer}{peer};
  delete $e->{peer};
  $paused = 0;
}
sub flush {
  my $e = shift;
  if (length $e->{out}) {
    my $n = syswrite($e->{fh}, $e->{out});
    if (!defined $n) { return if $! + 0 == $EAGAIN || $! + 0 == $EINTR; return drop($e) }
    substr($e->{out}, 0, $n, "");
  }
  return if length $e->{out} || !$e->{peer}{eof} || $e->{shut};
  shutdown($e->{fh}, 1);
  $e->{shut} = 1;
  drop($e) if $e->{peer}{shut};
}
sub fill {
  my $e = shift;
  my $got = sysread($e->{fh}, my $data, $CHUNK);
  if (!defined $got) { return if $! + 0 == $EAGAIN || $! + 0 == $EINTR; return drop($e) }
  if ($got == 0) { $e->{eof} = 1 } else { $e->{peer}{out} .= $data }
  flush($e->{peer});
}
# Accepted connections whose proxy socket waits for a descriptor, oldest first.
my @waiting;
sub carry {
  my ($c, $path) = @_;
  my $u = unix_conn($path);
  unless ($u) {
    return close $c unless out_of_descriptors();
    return push @waiting, [$c, $path];
  }
  setsockopt($c, 6, 1, pack("i", 1));
  nonblock($_) for $c, $u;
  my ($tcp, $unix) = map { +{ fh => $_, fd => fileno $_, out => "" } } $c, $u;
  ($tcp->{peer}, $unix->{peer}) = ($unix, $tcp);
  $end{$tcp->{fd}} = $tcp;
  $end{$unix->{fd}} = $unix;
}
while (1) {
  my ($rin, $win) = ("", "");
  vec($rin, 0, 1) = 1;
  $paused = 0 if $paused && time >= $paused;
  vec($rin, $_, 1) = 1 for $paused ? () : keys %listener;
  for my $e (values %end) {
    vec($rin, $e->{fd}, 1) = 1 if !$e->{eof} && length $e->{peer}{out} < $CAP;
    vec($win, $e->{fd}, 1) = 1 if length $e->{out};
  }
  my ($r, $w) = ($rin, $win);
  if (select($r, $w, undef, $paused ? 1 : undef) < 0) {
    next if $! + 0 == $EINTR;
    fail("select: $!", 1);
  }
  if (vec($r, 0, 1)) { exit 0 unless sysread(STDIN, my $ignored, 65536) }
  # Connections first: one that ends gives back the descriptors a new one needs.
  for my $fd (keys %end) {
    flush($end{$fd}) if $end{$fd} && vec($w, $fd, 1);
    fill($end{$fd}) if $end{$fd} && vec($r, $fd, 1);
  }
  carry(@$_) for $paused ? () : splice(@waiting);
  for (keys %listener) {
    next if $paused || !vec($r, $_, 1);
    my ($l, $path) = @{$listener{$_}};
    if (accept(my $c, $l)) { carry($c, $path) } else { out_of_descriptors() }
  }
}
`;

/** The argv that runs the relay with `args` (relay_host.ts `launchOnce`), inside the sandbox. */
export function localRelayArgv(args: readonly string[]): string[] {
  return [PERL, "-e", PROGRAM, "--", ...args];
}
