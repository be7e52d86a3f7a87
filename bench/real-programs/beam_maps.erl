%% Erlang/OTP under a memory limit: four processes (scheduled on all of the BEAM's
%% schedulers) each build a map of 100,000 base64 strings of 200 random bytes, then fold a
%% hash over every value. The BEAM's allocators map their carriers with mmap and trim each
%% one's head and tail to align it, from every scheduler thread; its garbage collector
%% copies each process's heap. Prints [{Part, Hash, Size}]: the same under every engine.
%% Plain: about 17 s and 420 MB of RSS on 2 vCPUs.
%%   erlc beam_maps.erl && erl -noshell -s beam_maps main
-module(beam_maps).
-export([main/0]).

main() ->
    N = 400000,
    Parts = 4,
    Self = self(),
    [spawn(fun() -> Self ! part(I, N, Parts) end) || I <- lists:seq(1, Parts)],
    R = [receive {I, H, S} -> {I, H, S} after 600000 -> timeout end || I <- lists:seq(1, Parts)],
    io:format("~p~n", [R]),
    init:stop().

part(I, N, Parts) ->
    rand:seed(exsss, {I, 2, 3}),
    Keys = lists:seq(I, N, Parts),
    M = maps:from_list([{K, value()} || K <- Keys]),
    H = lists:foldl(fun(K, Acc) -> erlang:phash2({Acc, maps:get(K, M)}) end, 0, Keys),
    {I, H, maps:size(M)}.

value() ->
    base64:encode(list_to_binary([rand:uniform(255) || _ <- lists:seq(1, 200)])).
