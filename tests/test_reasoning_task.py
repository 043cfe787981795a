"""The reasoning task's program layouts: the default chain (unchanged draws), and the cone and hub layouts in which
only part of the steps feed the answer (issue 17)."""

import random

import pytest

from envs.reasoning.task import Problem, ReasoningTask, ReasoningTaskConfig, Step, step_influence


def _readers(problem: Problem, name: str) -> list[int]:
    return [i for i, s in enumerate(problem.steps) if name in (s.left, s.right)]


def test_default_chain_layout_draws_the_same_programs_as_before():
    """The tour, the learning test and the SFT cache rely on the default task: its draws must not move."""
    problems = ReasoningTask().sample(random.Random(0), 3)
    assert [p.prompt for p in problems] == ["a=6;b=0;c=a+b;d=c+b;e=b+d;f=a-e;?f\n", "a=4;b=1;c=a-b;d=b+c;?d\n",
                                            "a=8;b=7;c=a-b;d=c+a;?d\n"]
    assert problems[1].solution.splitlines()[-1] == "ans=4"
    assert ReasoningTask().max_response_chars() == 4 * 16 + 6


@pytest.mark.parametrize("layout", ["cone", "hub"])
def test_cone_layouts_only_part_of_the_steps_feed_the_answer(layout):
    task = ReasoningTask(ReasoningTaskConfig(layout=layout, min_steps=6, max_steps=10, num_inputs=3))
    rng = random.Random(0)
    first_is_distractor, query_not_last, sizes = 0, 0, []
    for p in task.sample(rng, 300):
        cone = task.dependency_cone(p)
        assert len(cone) == p.difficulty + 1 and cone[-1] is False  # the answer line feeds nothing
        in_cone = [i for i, c in enumerate(cone[:-1]) if c]
        assert p.steps[in_cone[-1]].target == p.query
        assert len(in_cone) == round(0.5 * p.difficulty)
        cone_names = {p.steps[i].target for i in in_cone}
        for i, s in enumerate(p.steps):
            if not cone[i]:  # distractors are never read by a cone step
                assert not any(j in in_cone for j in _readers(p, s.target))
            elif s.target != p.query:  # every other cone step is read by a later cone step
                assert any(j in in_cone for j in _readers(p, s.target))
        if layout == "hub":
            h = (len(in_cone) - 1) // 2
            hub = p.steps[in_cone[h]].target
            assert all(hub in (p.steps[i].left, p.steps[i].right) for i in in_cone[h + 1:])
            assert step_influence(p, transitive=False)[in_cone[h]] >= len(in_cone) - h - 1 >= 1
        assert cone_names <= set(p.values)
        lines = p.solution.split("\n")
        assert lines[-1] == f"ans={p.query}{p.answer}" and task.reward(p, p.solution) == 1.0
        assert task.reward(p, p.solution[:-1] + str((p.answer + 1) % 10)) == 0.0
        assert len(p.solution) + 1 <= task.max_response_chars(p.difficulty)
        first_is_distractor += not cone[0]
        query_not_last += not cone[p.difficulty - 1]
        sizes.append(p.difficulty)
    # distractors spread over the trace, early ones included; the query is not always the last step
    assert 0.3 < first_is_distractor / 300 < 0.7 and query_not_last / 300 > 0.2
    assert set(sizes) == set(range(6, 11))


def test_dependency_cone_of_a_hand_written_program():
    steps = (Step("c", "a", "+", "b"), Step("d", "c", "+", "a"), Step("e", "a", "-", "b"), Step("f", "e", "+", "a"),
             Step("g", "d", "-", "a"))
    values = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 9, "f": 0, "g": 3}
    p = Problem((("a", 1), ("b", 2)), steps, "g", 10, 1, values, name_in_answer=True)
    assert p.dependency_cone() == [True, True, False, False, True, False]
    assert p.solution.split("\n")[-1] == "ans=g3"
    chain = Problem((("a", 1), ("b", 2)), steps, "g", 10, 1, values)
    assert chain.solution.split("\n")[-1] == "ans=3"


def test_cone_layout_config_is_checked():
    with pytest.raises(ValueError):
        ReasoningTaskConfig(layout="tree")
    with pytest.raises(ValueError):
        ReasoningTaskConfig(cone_fraction=0.0)
    with pytest.raises(ValueError):
        ReasoningTask(ReasoningTaskConfig(layout="cone")).sample(random.Random(0), 1, difficulty=1)
