#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
"""The runner's rules that decide which figures a summary uses: placement
of the two CPUs (docs/performance-notes.md 3.40) and re-measurement."""

import importlib.machinery
import importlib.util
import os
import sys
import unittest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "perftest-configs", "run")


def load_runner():
    loader = importlib.machinery.SourceFileLoader("perftest_configs_run", RUNNER)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


run = load_runner()


class Probed:
    """Stands in for the Runner: the probes taken so far."""

    def __init__(self, probes):
        self.rtt_probes = list(probes)

    far_line_ns = run.Runner.far_line_ns
    placements_differ = run.Runner.placements_differ


def figure(value, rtt_ns):
    return run.Figure(value, None, 1.0, rtt_ns)


class PlacementsDiffer(unittest.TestCase):
    def setUp(self):
        self.runner = Probed([52, 61, 318])  # far line: 104 ns

    def test_one_figure_on_each_side_of_twice_the_lowest_probe(self):
        self.assertTrue(self.runner.placements_differ(figure(10, 318), figure(20, 61)))
        self.assertTrue(self.runner.placements_differ(figure(10, 52), figure(20, 105)))

    def test_both_near_or_both_far_are_one_placement(self):
        self.assertFalse(self.runner.placements_differ(figure(10, 52), figure(20, 104)))
        self.assertFalse(self.runner.placements_differ(figure(10, 290), figure(20, 350)))

    def test_a_missing_figure_or_probe_is_never_taken_again(self):
        self.assertFalse(self.runner.placements_differ(None, figure(20, 318)))
        self.assertFalse(self.runner.placements_differ(figure(10, None), figure(20, 318)))


class InOnePlacement(unittest.TestCase):
    def setUp(self):
        self.runner = Probed([50])
        self.calls = []

    def measures(self, tcp_figures, siwx_figures):
        tcp, siwx = iter(tcp_figures), iter(siwx_figures)

        def measure(figures, name):
            self.calls.append(name)
            figure = next(figures)
            if figure is not None:
                self.runner.rtt_probes.append(figure.cpu_rtt_ns)
            return figure

        def measure_tcp():
            return measure(tcp, "tcp")

        def measure_siwx():
            return measure(siwx, "siwx")
        return measure_tcp, measure_siwx

    def test_a_pair_from_two_placements_is_taken_again_tcp_first(self):
        first_siwx, first_tcp = figure(9.9, 330), figure(21.0, 55)
        measure_tcp, measure_siwx = self.measures([figure(20.5, 58)], [figure(19.8, 60)])
        siwx, tcp, dropped = run.in_one_placement(self.runner, first_siwx, first_tcp,
                                                  measure_tcp, measure_siwx, 2)
        self.assertEqual(self.calls, ["tcp", "siwx"])
        self.assertEqual((siwx.value, tcp.value), (19.8, 20.5))
        self.assertEqual(dropped, [(first_siwx, first_tcp)])

    def test_the_side_the_difference_favoured_does_not_matter(self):
        # siwx near against TCP far favours siwx; it is taken again all the same.
        measure_tcp, measure_siwx = self.measures([figure(21.0, 57)], [figure(19.0, 52)])
        siwx, tcp, dropped = run.in_one_placement(self.runner, figure(20.0, 51),
                                                  figure(10.5, 320), measure_tcp,
                                                  measure_siwx, 2)
        self.assertEqual(len(dropped), 1)
        self.assertAlmostEqual(siwx.value / tcp.value, 19.0 / 21.0)

    def test_one_placement_is_kept_as_measured(self):
        measure_tcp, measure_siwx = self.measures([], [])
        siwx, tcp, dropped = run.in_one_placement(self.runner, figure(10.0, 310),
                                                  figure(11.0, 300), measure_tcp,
                                                  measure_siwx, 2)
        self.assertEqual(self.calls, [])
        self.assertEqual(dropped, [])
        self.assertEqual((siwx.value, tcp.value), (10.0, 11.0))

    def test_at_most_retries_times_then_the_last_pair_is_kept(self):
        measure_tcp, measure_siwx = self.measures(
            [figure(20.0, 300), figure(21.0, 320)], [figure(19.0, 52), figure(18.0, 54)])
        siwx, tcp, dropped = run.in_one_placement(self.runner, figure(10.0, 330),
                                                  figure(22.0, 51), measure_tcp,
                                                  measure_siwx, 2)
        self.assertEqual(self.calls, ["tcp", "siwx", "tcp", "siwx"])
        self.assertEqual(len(dropped), 2)
        self.assertEqual((siwx.value, tcp.value), (18.0, 21.0))
        self.assertTrue(self.runner.placements_differ(siwx, tcp))

    def test_a_failed_attempt_keeps_the_pair_it_was_to_replace(self):
        first_siwx, first_tcp = figure(10.0, 330), figure(22.0, 51)
        for tcp_figures, siwx_figures, calls in (([None], [], ["tcp"]),
                                                 ([figure(20.0, 52)], [None], ["tcp", "siwx"])):
            self.calls = []
            measure_tcp, measure_siwx = self.measures(tcp_figures, siwx_figures)
            siwx, tcp, dropped = run.in_one_placement(self.runner, first_siwx, first_tcp,
                                                      measure_tcp, measure_siwx, 2)
            self.assertEqual(self.calls, calls)
            self.assertEqual((siwx, tcp, dropped), (first_siwx, first_tcp, []))

    def test_no_retries_keeps_the_first_pair(self):
        measure_tcp, measure_siwx = self.measures([], [])
        siwx, tcp, dropped = run.in_one_placement(self.runner, figure(10.0, 330),
                                                  figure(22.0, 51), measure_tcp,
                                                  measure_siwx, 0)
        self.assertEqual((siwx.value, tcp.value, dropped), (10.0, 22.0, []))


class Summary(unittest.TestCase):
    @staticmethod
    def row(rnd, siwx, tcp, superseded=False):
        return {"test": "ib_send_bw", "reference": "iperf3 -l 65536", "size": 65536,
                "qps": 1, "round": rnd, "siwx": siwx, "tcp": tcp, "ratio": siwx / tcp,
                "units": "Gb/s", "siwx_p99": None, "tcp_p99": None,
                "siwx_cpu_per_gb": 0.8, "tcp_cpu_per_gb": 0.4, "cpu_ratio": 2.0,
                "siwx_cpu_rtt_ns": 60, "tcp_cpu_rtt_ns": 60, "superseded": int(superseded)}

    def test_superseded_figures_stay_out_of_the_medians(self):
        rows = [self.row(1, 10.0, 20.0, superseded=True), self.row(1, 20.0, 20.0),
                self.row(2, 22.0, 20.0), self.row(3, 24.0, 20.0)]
        rows[1]["cpu_ratio"] = rows[2]["cpu_ratio"] = rows[3]["cpu_ratio"] = 1.1
        [summary] = run.summarize(rows, 3)
        self.assertEqual(summary["ok"], 3)
        self.assertAlmostEqual(summary["ratio"], 1.1)
        self.assertAlmostEqual(summary["cpu_ratio"], 1.1)
        self.assertEqual(summary["siwx"], 22.0)


if __name__ == "__main__":
    sys.exit(unittest.main())
