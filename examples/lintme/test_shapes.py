import unittest

from shapes import area, describe


class ShapesTest(unittest.TestCase):
    def test_area(self):
        self.assertAlmostEqual(area(1), 3.14159, places=4)

    def test_describe_none(self):
        self.assertEqual(describe(None), "no circle")


if __name__ == "__main__":
    unittest.main()
