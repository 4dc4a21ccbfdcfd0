"""The top floor: the commands a person runs that are not torchrun mains — `fabricbench`'s
dispatcher (cli), the machine's fabric inventory (doctor), the emulator's command (emulate), and
the machinery every launch/*.py entry point shares (entry). Nothing below imports from here; they
import what they need from every floor beneath."""
