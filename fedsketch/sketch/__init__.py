"""The Count Sketch (Charikar, Chen and Farach-Colton, 2002) of a flat vector, as FetchSGD uses it.

``count_sketch`` the sketch and its operations, ``hashing`` its hash family, ``estimates`` reading
estimates back, ``batch`` many tables at once on a GPU, ``checks`` the arguments every sketch refuses.
"""
