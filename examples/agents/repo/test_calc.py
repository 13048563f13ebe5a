import unittest

import calc


class AddTest(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(calc.add(2, 3), 5)
        self.assertEqual(calc.add(-1, 1), 0)


if __name__ == "__main__":
    unittest.main()
